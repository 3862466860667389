import { defineConfig } from 'vitest/config';

// Unit tests of the plain logic modules (no DOM, no JupyterLab): route table, calendar, progress.
export default defineConfig({
  test: {
    include: ['src/__tests__/**/*.test.ts'],
    environment: 'node'
  }
});
