import { afterEach, describe, expect, it, vi } from 'vitest';

import { askImplementation, IInfoAsker } from '../kernelInfo';

const answering = (implementation: unknown): IInfoAsker => ({
  requestKernelInfo: async () => ({ content: { implementation } })
});

describe('asking a kernel which implementation answers it', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('returns the implementation the kernel answers with', async () => {
    expect(await askImplementation(answering('portable-placeholder'))).toBe('portable-placeholder');
    expect(await askImplementation(answering('ipython'))).toBe('ipython');
  });

  it('returns nothing for no kernel, a failed request, or an answer without a name', async () => {
    expect(await askImplementation(null)).toBe('');
    expect(await askImplementation(undefined)).toBe('');
    expect(await askImplementation({ requestKernelInfo: () => Promise.reject(new Error('disposed')) })).toBe('');
    expect(await askImplementation({ requestKernelInfo: async () => undefined })).toBe('');
    expect(await askImplementation(answering(42))).toBe('');
  });

  it('gives up on a request that is never answered (one sent on a dropped websocket)', async () => {
    vi.useFakeTimers();
    let asked = 0;
    const never: IInfoAsker = {
      requestKernelInfo: () => {
        asked++;
        return new Promise(() => undefined);
      }
    };
    let answer: string | null = null;
    void askImplementation(never, 5000).then(a => {
      answer = a;
    });
    await vi.advanceTimersByTimeAsync(4999);
    expect(answer).toBeNull();
    await vi.advanceTimersByTimeAsync(1);
    expect(answer).toBe('');
    expect(asked).toBe(1);
  });

  it('leaves no timer behind once answered', async () => {
    vi.useFakeTimers();
    expect(await askImplementation(answering('ipython'), 5000)).toBe('ipython');
    expect(vi.getTimerCount()).toBe(0);
  });
});
