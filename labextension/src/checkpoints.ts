/**
 * Checkpoints in flight, as the sidebar's Checkpoints section shows them (issue 44): each one on its
 * way to verified with its phase, percent and rate, and, for a while after it ended, that it is
 * verified ("latest") or why not. The words are the server's (`line`, `phase`: core/state_words.py,
 * the same the CLI prints); the sidebar adds only the bar, the mark and where it runs.
 */

import * as fmt from './format';
import { ICheckpointInFlight, IPortableState } from './types';

export type CheckpointRowKind = 'moving' | 'waiting' | 'verified' | 'failed';

/** What one row shows. */
export interface ICheckpointRow {
  key: string;
  kind: CheckpointRowKind;
  /** ⇡ moving, … waiting (queued, sealing), ✓ verified, ✗ not verified. */
  mark: string;
  /** The server's line: "step 1200: uploading 63%, 1.1 GB/s". */
  text: string;
  /** The bar's fill, 0-100, while bytes move; null otherwise. */
  percent: number | null;
  /** "on the machine al-…" for a checkpoint its worker reported; null on this computer. */
  where: string | null;
  /** The figures behind the line: "630 MB of 1.0 GB" (what the hover says). */
  title: string;
}

const MARK: { [K in CheckpointRowKind]: string } = {
  moving: '⇡',
  waiting: '…',
  verified: '✓',
  failed: '✗'
};

function kindOf(c: ICheckpointInFlight): CheckpointRowKind {
  if (c.ended !== null) {
    return c.state === 'verified' ? 'verified' : 'failed';
  }
  return c.percent !== null ? 'moving' : 'waiting';
}

/** One row of a checkpoint in flight, or of how one ended. */
export function checkpointRow(c: ICheckpointInFlight): ICheckpointRow {
  const kind = kindOf(c);
  const title =
    kind === 'moving'
      ? `${fmt.bytes(c.done_bytes)} of ${fmt.bytes(c.total_bytes)} ${c.phase}` +
        (c.rate > 0 ? ` at ${fmt.bytes(c.rate)}/s` : '')
      : c.reason ?? `${c.path}: ${c.phase}`;
  return {
    key: c.key,
    kind,
    mark: MARK[kind],
    text: c.line,
    percent: kind === 'moving' ? Math.max(0, Math.min(100, c.percent ?? 0)) : null,
    where: c.machine ? `on the machine ${c.machine}` : null,
    title
  };
}

/** The rows of the state's checkpoints in flight, in the server's order (in flight, then ended). */
export function checkpointRows(state: Pick<IPortableState, 'checkpoints_in_flight'>): ICheckpointRow[] {
  return (state.checkpoints_in_flight ?? []).map(checkpointRow);
}
