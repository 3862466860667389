import { describe, expect, it } from 'vitest';

import { check } from '../../scripts/gen-types.mjs';

describe('src/types.ts', () => {
  it('is what the REST API schemas generate (run `jlpm gen:types` if not)', async () => {
    const { generated, committed } = await check();
    expect(committed, 'src/types.ts is stale: run `jlpm gen:types` in labextension/').toBe(generated);
  });
});
