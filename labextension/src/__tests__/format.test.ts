import { describe, expect, it } from 'vitest';

import { age, bytes, duration, environmentLine, envChangeLine, firstMachineQuestion, money, readyLine, snapshotLine } from '../format';

describe('numbers as the sidebar shows them', () => {
  it('money', () => {
    expect(money(1.234)).toBe('$1.23');
    expect(money(0)).toBe('$0.00');
    expect(money(0.004)).toBe('<$0.01');
    expect(money(null)).toBe('—');
  });

  it('durations, rounded as the routing core rounds them', () => {
    expect(duration(42)).toBe('42 s');
    expect(duration(600)).toBe('10 min');
    expect(duration(9000)).toBe('2.5 h');
    expect(duration(-3)).toBe('0 s');
  });

  it('time to Ready, measured against what the route predicted', () => {
    const predicted = { time_to_ready_s: 35.2 };
    expect(readyLine({ predicted, measured: { time_to_ready_s: 41.4 } })).toBe('ready in 41 s (predicted 35 s)');
    expect(readyLine({ predicted, measured: null })).toBeNull();
    expect(readyLine(null)).toBeNull();
    expect(readyLine({ measured: { time_to_ready_s: 200 } })).toBe('ready in 3 min');
  });

  it('ages and sizes', () => {
    const now = Date.parse('2026-12-01T10:10:00Z');
    expect(age('2026-12-01T10:00:00Z', now)).toBe('10 min ago');
    expect(age('2026-12-01T10:09:58Z', now)).toBe('just now');
    expect(age(null, now)).toBe('—');
    expect(bytes(123456)).toBe('123 KB');
    expect(bytes(1_500_000_000)).toBe('1.5 GB');
    expect(bytes(12)).toBe('12 B');
  });
});

describe('the question before the first machine', () => {
  it('names the GPU, provider, region and $/h, and the route', () => {
    const route = { gpu: 'NVIDIA L4', gpu_count: 1, provider: 'local', offer: 'l4', region: 'local-a', price_per_hour: 0.4 };
    expect(firstMachineQuestion(route)).toBe(
      'Rent NVIDIA L4 on local (local-a) at $0.40/h? This notebook has no GPU machine yet (route local/l4).'
    );
    expect(firstMachineQuestion({ ...route, gpu_count: 8, region: null, price_per_hour: 24 })).toContain(
      'Rent 8x NVIDIA L4 on local (any region) at $24.00/h?'
    );
  });
});

describe('the environment line of the Ready message', () => {
  const change = { name: 'ipython', recorded: '9.18.1', installed: '8.39.0', why: 'requires-python', kind: 'changed', detail: '' };
  it('says nothing when the machine has exactly the recorded environment', () => {
    expect(environmentLine({ exact: true, summary: 'exact: every recorded version', mode: 'lockfile' })).toBeNull();
    expect(environmentLine(null)).toBeNull();
  });
  it('shows the Python and each difference otherwise', () => {
    const summary = 'Python 3.11.7 -> 3.10.13; 1 difference from the recorded environment: ipython 9.18.1 -> 8.39.0 (requires-python)';
    expect(environmentLine({ exact: false, summary, mode: 'lockfile' })).toBe(`Environment: ${summary}`);
    expect(envChangeLine(change)).toBe('ipython 9.18.1 -> 8.39.0 (requires-python)');
    expect(envChangeLine({ ...change, kind: 'left-out', installed: null, why: 'platform-only', name: 'pyobjc-core', recorded: '10.3' })).toBe(
      'pyobjc-core 10.3: left out (platform-only)'
    );
  });
});

describe('the snapshot result line', () => {
  it('says how many files were not backed up', () => {
    expect(snapshotLine(7, true, 0)).toBe('Snapshot version 7 published');
    expect(snapshotLine(7, false, 0)).toBe('Nothing changed since version 7');
    expect(snapshotLine(7, true, 2)).toMatch(/^Snapshot version 7 published; 2 files not backed up/);
    expect(snapshotLine(7, true, 1)).toMatch(/; 1 file not backed up/);
  });
});
