import { describe, expect, it } from 'vitest';

import {
  applyProgressEvent,
  applyStateEvent,
  idleProgress,
  IContinueProgress,
  progressFromLifecycle,
  stepFraction
} from '../progress';
import { ILifecycle, ILifecycleEvent, LifecycleState } from '../types';

let seq = 0;
function ev(state: LifecycleState, previous: LifecycleState | null, over: Partial<ILifecycleEvent> = {}): ILifecycleEvent {
  seq += 1;
  return {
    seq,
    state,
    previous,
    reason: null,
    allocation_id: null,
    route: null,
    version: 7,
    verified: false,
    at: '2026-12-01T10:00:00Z',
    ...over
  };
}

function run(events: ILifecycleEvent[], from: IContinueProgress = idleProgress()): IContinueProgress {
  return events.reduce(applyStateEvent, from);
}

const statuses = (p: IContinueProgress) => Object.values(p.steps).map(s => s.status);

describe('Continue progress', () => {
  it('walks acquire, probe, materialize, verify, reconnect to Ready', () => {
    seq = 10;
    const p1 = run([ev('ROUTING', 'LOST'), ev('ACQUIRING', 'ROUTING', { route: 'r-a' }), ev('PROBING', 'ACQUIRING', { route: 'r-a' })]);
    expect(p1.running).toBe(true);
    expect(p1.route).toBe('r-a');
    expect(statuses(p1)).toEqual(['done', 'running', 'pending', 'pending', 'pending']);
    const p2 = run(
      [
        ev('MATERIALIZING', 'PROBING', { route: 'r-a' }),
        ev('VERIFYING', 'MATERIALIZING', { route: 'r-a' }),
        ev('READY', 'VERIFYING', { route: 'r-a', verified: true })
      ],
      p1
    );
    expect(statuses(p2)).toEqual(['done', 'done', 'done', 'done', 'running']);
    const p3 = run([ev('ACTIVE', 'READY', { route: 'r-a', verified: true })], p2);
    expect(p3.running).toBe(false);
    expect(p3.outcome).toBe('ready');
    expect(statuses(p3)).toEqual(['done', 'done', 'done', 'done', 'done']);
  });

  it('records the route given up, why, and the one tried next', () => {
    seq = 100;
    const p = run([
      ev('ROUTING', 'LOST'),
      ev('ACQUIRING', 'ROUTING', { route: 'r-a' }),
      ev('PROBING', 'ACQUIRING', { route: 'r-a' }),
      ev('ACQUIRING', 'PROBING', {
        route: 'r-b',
        reason: 'admission refused: driver 535.1, 550.54.15 pinned',
        detail: { route_given_up: 'r-a' }
      })
    ]);
    expect(p.failovers).toEqual([
      { route: 'r-a', reason: 'admission refused: driver 535.1, 550.54.15 pinned', next: 'r-b', at: '2026-12-01T10:00:00Z' }
    ]);
    expect(p.route).toBe('r-b');
    expect(statuses(p)).toEqual(['running', 'pending', 'pending', 'pending', 'pending']);
  });

  it('counts a failed launch on one route, then the next, as a failover', () => {
    seq = 200;
    const p = run([
      ev('ROUTING', 'FAILED'),
      ev('ACQUIRING', 'ROUTING', { route: 'r-a' }),
      ev('ACQUIRING', 'ACQUIRING', { route: 'r-a', allocation_id: 'al-1' }), // the write-ahead: same route
      ev('ACQUIRING', 'ACQUIRING', { route: 'r-b', reason: 'launch failed: no capacity' })
    ]);
    expect(p.failovers.map(f => [f.route, f.reason, f.next])).toEqual([['r-a', 'launch failed: no capacity', 'r-b']]);
  });

  it('marks the running step failed and keeps the reason when Continue fails', () => {
    seq = 300;
    const p = run([
      ev('ROUTING', 'LOST'),
      ev('ACQUIRING', 'ROUTING', { route: 'r-a' }),
      ev('PROBING', 'ACQUIRING', { route: 'r-a' }),
      ev('MATERIALIZING', 'PROBING', { route: 'r-a' }),
      ev('FAILED', 'MATERIALIZING', { reason: 'a file did not hash equal: data/x.bin' })
    ]);
    expect(p.outcome).toBe('failed');
    expect(p.running).toBe(false);
    expect(p.reason).toBe('a file did not hash equal: data/x.bin');
    expect(statuses(p)).toEqual(['done', 'done', 'failed', 'pending', 'pending']);
  });

  it('starts clean on a new Continue and ignores events it has already seen', () => {
    seq = 400;
    const failed = run([ev('ROUTING', 'LOST'), ev('FAILED', 'ROUTING', { reason: 'no route' })]);
    const old = ev('ACQUIRING', 'ROUTING', { route: 'r-z', seq: 1 });
    expect(applyStateEvent(failed, old)).toBe(failed);
    const again = run([ev('ROUTING', 'FAILED')], failed);
    expect(again.outcome).toBeNull();
    expect(again.failovers).toEqual([]);
    expect(again.running).toBe(true);
  });

  it('materializes again after a read-back that differed', () => {
    seq = 500;
    const p = run([
      ev('ROUTING', 'LOST'),
      ev('ACQUIRING', 'ROUTING', { route: 'r-a' }),
      ev('PROBING', 'ACQUIRING', { route: 'r-a' }),
      ev('MATERIALIZING', 'PROBING', { route: 'r-a' }),
      ev('VERIFYING', 'MATERIALIZING', { route: 'r-a' }),
      ev('MATERIALIZING', 'VERIFYING', { route: 'r-a', reason: 'checkpoint hash differs' })
    ]);
    expect(statuses(p)).toEqual(['done', 'done', 'running', 'pending', 'pending']);
    expect(p.reason).toBe('checkpoint hash differs');
  });

  it('shows step sizes from progress events', () => {
    seq = 600;
    let p = run([ev('ROUTING', 'LOST'), ev('ACQUIRING', 'ROUTING', { route: 'r-a' })]);
    p = applyProgressEvent(p, { workspace_id: 'ws', step: 'acquire', message: 'launching', done: null, total: null });
    expect(p.steps.acquire.message).toBe('launching');
    p = run([ev('PROBING', 'ACQUIRING', { route: 'r-a' }), ev('MATERIALIZING', 'PROBING', { route: 'r-a' })], p);
    p = applyProgressEvent(p, { workspace_id: 'ws', step: 'materialize', message: '3 of 12 files', done: 3, total: 12 });
    expect(stepFraction(p.steps.materialize)).toBeCloseTo(0.25);
    expect(stepFraction(p.steps.acquire)).toBe(1);
    expect(stepFraction(p.steps.verify)).toBeNull();
    expect(applyProgressEvent(p, { workspace_id: 'ws', step: 'snapshot', message: 'x', done: 1, total: 2 })).toBe(p);
  });

  it('is rebuilt from the stored events after a reload', () => {
    seq = 700;
    const events = [
      ev('ACTIVE', 'READY'),
      ev('LOST', 'ACTIVE', { reason: 'preempted by the market' }),
      ev('ROUTING', 'LOST'),
      ev('ACQUIRING', 'ROUTING', { route: 'r-a' }),
      ev('PROBING', 'ACQUIRING', { route: 'r-a' })
    ];
    const lifecycle: ILifecycle = {
      state: 'PROBING',
      allocation_id: 'al-2',
      route: 'r-a',
      version: 7,
      verified: false,
      epoch: 2,
      updated: '2026-12-01T10:00:00Z',
      attempts: [],
      events
    };
    const p = progressFromLifecycle(lifecycle);
    expect(p.running).toBe(true);
    expect(p.startSeq).toBe(events[2].seq);
    expect(statuses(p)).toEqual(['done', 'running', 'pending', 'pending', 'pending']);
    // Nothing newer: the live progress, with its messages, is kept as it is.
    expect(progressFromLifecycle(lifecycle, p)).toBe(p);
  });

  it('shows no Continue while the machine is lost', () => {
    seq = 800;
    const lifecycle: ILifecycle = {
      state: 'LOST',
      allocation_id: 'al-1',
      route: null,
      version: 7,
      verified: false,
      epoch: 1,
      updated: '2026-12-01T10:00:00Z',
      attempts: [],
      events: [ev('ROUTING', 'IDLE'), ev('ACQUIRING', 'ROUTING', { route: 'r-a' }), ev('LOST', 'ACTIVE', { reason: 'gone' })]
    };
    const p = progressFromLifecycle(lifecycle);
    expect(p.running).toBe(false);
    expect(p.outcome).toBeNull();
    expect(p.state).toBe('LOST');
  });
});
