import { describe, expect, it } from 'vitest';

import { checkpointRow, checkpointRows } from '../checkpoints';
import { ICheckpointInFlight } from '../types';

/** A row of the state's checkpoints_in_flight as the server sends one (state.json), with overrides. */
const ck = (over: Partial<ICheckpointInFlight>): ICheckpointInFlight => ({
  key: '4242-1700000000000000000-1',
  path: 'ckpt/step-1200.pt',
  step: 1200,
  state: 'uploading',
  phase: 'uploading',
  percent: 63,
  done_bytes: 630_000_000,
  total_bytes: 1_000_000_000,
  size: 1_000_000_000,
  rate: 1.1e9,
  reason: null,
  ended: null,
  since: '2026-12-06T21:39:59.000Z',
  version: null,
  latest: false,
  machine: null,
  line: 'step 1200: uploading 63%, 1.1 GB/s',
  ...over
});

describe('checkpoints in flight in the sidebar', () => {
  it('shows an upload with the server line, a bar at its percent and the bytes behind it', () => {
    const row = checkpointRow(ck({}));
    expect(row).toMatchObject({ kind: 'moving', mark: '⇡', percent: 63, where: null });
    expect(row.text).toBe('step 1200: uploading 63%, 1.1 GB/s');
    expect(row.title).toBe('630 MB of 1.0 GB uploading at 1.1 GB/s');
  });

  it('reads back and seals in the server words; only a phase that moves bytes has a bar', () => {
    const back = checkpointRow(
      ck({ state: 'verifying', phase: 'reading back', percent: 20, line: 'step 1200: reading back 20%' })
    );
    expect(back).toMatchObject({ kind: 'moving', percent: 20, text: 'step 1200: reading back 20%' });
    const sealing = checkpointRow(ck({ state: 'publishing', phase: 'sealing', percent: null, line: 'step 1200: sealing' }));
    expect(sealing).toMatchObject({ kind: 'waiting', mark: '…', percent: null, text: 'step 1200: sealing' });
    const queued = checkpointRow(ck({ state: 'queued', phase: 'queued', percent: null, line: 'step 1200: queued' }));
    expect(queued.kind).toBe('waiting');
  });

  it('says when one ended verified, and that it is latest, as the server decided', () => {
    const row = checkpointRow(
      ck({
        state: 'verified',
        phase: 'verified',
        percent: null,
        ended: '2026-12-06T21:40:00.000Z',
        version: 7,
        latest: true,
        line: 'step 1200: verified, latest (version 7)'
      })
    );
    expect(row).toMatchObject({ kind: 'verified', mark: '✓', percent: null });
    expect(row.text).toBe('step 1200: verified, latest (version 7)');
  });

  it('says why one failed, and where it ran', () => {
    const reason = 'the process uploading it (pid 4242) ended before it was verified; latest stays on the last verified checkpoint';
    const row = checkpointRow(
      ck({
        state: 'failed',
        phase: 'failed',
        percent: 40, // a last record written mid-upload: an ended one has no bar
        ended: '2026-12-06T21:41:00.000Z',
        reason,
        machine: 'al-1a2b3c',
        line: `step 1200: failed: ${reason}`
      })
    );
    expect(row).toMatchObject({ kind: 'failed', mark: '✗', percent: null, where: 'on the machine al-1a2b3c' });
    expect(row.text).toContain('failed: the process uploading it');
    expect(row.title).toBe(reason);
  });

  it('keeps the server order, and shows nothing for an older server', () => {
    const rows = checkpointRows({
      checkpoints_in_flight: [
        ck({ key: 'a', line: 'step 1300: uploading 5%' }),
        ck({ key: 'b', state: 'verified', ended: '2026-12-06T21:40:00.000Z', percent: null, line: 'step 1200: verified' })
      ]
    });
    expect(rows.map(r => [r.key, r.kind])).toEqual([
      ['a', 'moving'],
      ['b', 'verified']
    ]);
    expect(checkpointRows({})).toEqual([]);
    expect(checkpointRow(ck({ percent: 140 })).percent).toBe(100);
  });
});
