import { describe, expect, it } from 'vitest';

import { runningLine } from '../components/WorkspacePanel';
import { IPortableState } from '../types';

// the parts of the server's state (GET /portable/api/state, state.json) the running line reads, as
// tests/test_unreachable.py sees the server answer them during a partition and after it
const running = (unreachable: IPortableState['unreachable']): IPortableState =>
  ({
    lifecycle: { state: 'ACTIVE', allocation_id: 'al-1' },
    allocation: {
      allocation_id: 'al-1',
      provider: 'ssh',
      offer: 'box',
      gpu: 'NVIDIA H100 80GB HBM3',
      gpu_count: 1,
      region: 'loopback',
      estimate: null
    },
    unreachable
  }) as unknown as IPortableState;

describe('the sidebar while the machine does not answer (issue 42)', () => {
  it('says "unreachable since" with the machine still held, and then the machine again', () => {
    const silent = runningLine(
      running({
        allocation_id: 'al-1',
        since: '2026-12-06T14:02:05Z',
        line: 'unreachable since 14:02Z',
        reason: 'ssh host does not answer'
      })
    );
    expect(silent).toContain('Running on NVIDIA H100 80GB HBM3');
    expect(silent).toContain(
      'unreachable since 14:02Z: nothing is released while its provider may still run it.'
    );
    const back = runningLine(running(null));
    expect(back).toMatch(/^Running on NVIDIA H100 80GB HBM3 .*\.$/);
    expect(back).not.toContain('unreachable');
  });

  it('is no running line when the workspace runs on no machine', () => {
    const lost = { ...running(null), lifecycle: { state: 'LOST' } } as unknown as IPortableState;
    expect(runningLine(lost)).toBeNull();
  });
});
