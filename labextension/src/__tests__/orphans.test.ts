import { describe, expect, it } from 'vitest';

import { orphanText } from '../components/OrphansPanel';
import { IOrphanMachine } from '../types';

const machine: IOrphanMachine = {
  provider: 'runpod',
  ref: 'pod-1',
  allocation_id: 'al-0123456789ab',
  workspace_id: 'ws-1',
  state: 'running',
  name: 'jupyter-portable.al-0123456789ab.ws-1',
  started: '2026-12-01T10:00:00Z',
  uptime_s: 3725,
  price_per_hour: 2.69,
  spend: 2.78,
  spend_source: 'provider-rate',
  orphan: true,
  why: 'not the current allocation of ws-1'
};

describe('orphanText', () => {
  it('names the machine, whose it was, how long it has run and what it cost', () => {
    expect(orphanText(machine)).toBe(
      'runpod pod-1 (allocation al-0123456789ab, workspace ws-1): running, up 1h02m, $2.78 so far'
    );
  });

  it('says when the cost is an estimate, and leaves out what is unknown', () => {
    expect(orphanText({ ...machine, spend_source: 'estimate' })).toContain('$2.78 so far (estimated)');
    expect(orphanText({ ...machine, uptime_s: null, spend: null })).toBe(
      'runpod pod-1 (allocation al-0123456789ab, workspace ws-1): running'
    );
  });
});
