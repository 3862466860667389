/**
 * Continue, step by step, as the events tell it: which step runs, which are done, the
 * routes given up (with why) and the one tried next, and how it ended. Pure reducers over
 * state/v1 and progress/v1 events; the same replay rebuilds it from the lifecycle's stored
 * events, so a reload in the middle of a Continue shows where it is.
 */

import { IProgressEvent } from './events';
import {
  CONTINUE_FROM as CONTINUE_FROM_STATES,
  CONTINUE_STEPS,
  ILifecycle,
  ILifecycleEvent,
  LifecycleState,
  STATE_STEP as STATE_STEPS
} from './types';

/** The states a Continue may begin from (generated from state.json: core/lifecycle.py's). */
export const CONTINUE_FROM: ReadonlySet<string> = new Set<string>(CONTINUE_FROM_STATES);

/** The steps of a Continue, in order (generated from state.json: core/lifecycle.py's). */
export const STEPS = CONTINUE_STEPS;
export type ContinueStep = (typeof STEPS)[number];

export const STEP_LABEL: { [K in ContinueStep]: string } = {
  acquire: 'Acquire a machine',
  probe: 'Probe GPU and driver',
  materialize: 'Materialize the workspace',
  verify: 'Verify the read-back',
  reconnect: 'Reconnect the kernel'
};

// The step that runs in each lifecycle state (generated: core/lifecycle.py STATE_STEP).
const STATE_STEP: { readonly [state: string]: ContinueStep } = STATE_STEPS;

export type StepStatus = 'pending' | 'running' | 'done' | 'failed';

export interface IStepProgress {
  status: StepStatus;
  message: string | null;
  done: number | null;
  total: number | null;
  /** When the step began and ended (the events' times), for its duration. */
  started?: string | null;
  ended?: string | null;
}

export interface IFailover {
  /** The route given up on. */
  route: string | null;
  reason: string;
  /** The route tried next, once known. */
  next: string | null;
  at: string | null;
}

export interface IContinueProgress {
  /** A Continue is between ROUTING and ACTIVE/FAILED. */
  running: boolean;
  state: LifecycleState | null;
  /** The route being tried now (or last tried). */
  route: string | null;
  steps: { [K in ContinueStep]: IStepProgress };
  failovers: IFailover[];
  outcome: 'ready' | 'failed' | null;
  /** The reason of the last move that needed one (a failure, a roll-back). */
  reason: string | null;
  /** The seq of the event that began this Continue (0: none). */
  startSeq: number;
  /** The last event applied. */
  seq: number;
}

function freshSteps(): { [K in ContinueStep]: IStepProgress } {
  const steps = {} as { [K in ContinueStep]: IStepProgress };
  for (const step of STEPS) {
    steps[step] = { status: 'pending', message: null, done: null, total: null };
  }
  return steps;
}

/** No Continue seen yet. */
export function idleProgress(seq = 0): IContinueProgress {
  return {
    running: false,
    state: null,
    route: null,
    steps: freshSteps(),
    failovers: [],
    outcome: null,
    reason: null,
    startSeq: 0,
    seq
  };
}

function text(value: unknown): string | null {
  return typeof value === 'string' && value ? value : null;
}

/** Mark steps before ``current`` done, ``current`` running, later ones pending. */
function runStep(
  steps: { [K in ContinueStep]: IStepProgress },
  current: ContinueStep,
  when: string | null = null
): { [K in ContinueStep]: IStepProgress } {
  const at = STEPS.indexOf(current);
  const out = { ...steps };
  STEPS.forEach((step, i) => {
    const status: StepStatus = i < at ? 'done' : i === at ? 'running' : 'pending';
    if (out[step].status !== status) {
      out[step] =
        status === 'pending'
          ? { status, message: null, done: null, total: null }
          : status === 'running'
            ? { ...out[step], status, started: when, ended: null }
            : { ...out[step], status, ended: out[step].ended ?? when };
    }
  });
  return out;
}

/** How long a step took (or has run, to ``now`` in ms), in seconds; null when unknown. */
export function stepSeconds(step: IStepProgress, now: number): number | null {
  const t0 = step.started ? Date.parse(step.started) : NaN;
  if (Number.isNaN(t0)) {
    return null;
  }
  const t1 = step.ended ? Date.parse(step.ended) : step.status === 'running' ? now : NaN;
  return Number.isNaN(t1) ? null : Math.max(0, (t1 - t0) / 1000);
}

/**
 * The progress after one lifecycle transition. Events at or before the last one applied
 * are ignored, so an event that arrives both live and in a fetched state counts once.
 */
export function applyStateEvent(
  progress: IContinueProgress,
  ev: ILifecycleEvent
): IContinueProgress {
  if (ev.seq <= progress.seq) {
    return progress;
  }
  const p: IContinueProgress = { ...progress, state: ev.state, seq: ev.seq };
  const previous = ev.previous;

  if (ev.state === 'ROUTING') {
    if (previous === null || CONTINUE_FROM.has(previous)) {
      // A new Continue: what the last one did no longer applies.
      return {
        ...idleProgress(ev.seq),
        running: true,
        state: 'ROUTING',
        startSeq: ev.seq
      };
    }
    // A restart rolled back to routing; the failovers so far still stand.
    return {
      ...p,
      running: true,
      route: null,
      steps: freshSteps(),
      reason: ev.reason ?? p.reason
    };
  }

  const step = STATE_STEP[ev.state];
  if (step) {
    const failover =
      ev.state === 'ACQUIRING' &&
      (previous === 'PROBING' ||
        (previous === 'ACQUIRING' && ev.route !== p.route && p.route !== null));
    let failovers = p.failovers;
    let steps = p.steps;
    if (failover) {
      const detail = ev.detail ?? {};
      const given =
        text(detail['route_given_up']) ??
        text(detail['given_up']) ??
        text(detail['from_route']) ??
        p.route;
      const why =
        text(detail['why']) ?? text(detail['reason']) ?? ev.reason ?? 'failed';
      failovers = [
        ...failovers,
        { route: given, reason: why, next: ev.route, at: ev.at }
      ];
      steps = freshSteps();
    }
    if (previous === 'VERIFYING' && ev.state === 'MATERIALIZING') {
      // The read-back found a difference: materialize again, verify again.
      steps = { ...steps, verify: { status: 'pending', message: null, done: null, total: null } };
    }
    return {
      ...p,
      running: true,
      route: ev.route ?? p.route,
      steps: runStep(steps, step, ev.at ?? null),
      failovers,
      reason: ev.reason ?? (failover ? p.reason : null)
    };
  }

  if (ev.state === 'ACTIVE' && previous === 'READY') {
    const steps = { ...p.steps };
    for (const s of STEPS) {
      steps[s] = { ...steps[s], status: 'done', ended: steps[s].ended ?? ev.at ?? null };
    }
    return { ...p, running: false, steps, outcome: 'ready', reason: null };
  }

  if (ev.state === 'FAILED') {
    const steps = { ...p.steps };
    const running = STEPS.find(s => steps[s].status === 'running');
    if (running) {
      steps[running] = { ...steps[running], status: 'failed', ended: ev.at ?? null };
    }
    return {
      ...p,
      running: false,
      steps,
      outcome: 'failed',
      reason: ev.reason ?? 'the Continue failed'
    };
  }

  // LOST, DRAINING, SEALED, RELEASED: the allocation side; no Continue in flight.
  return { ...idleProgress(ev.seq), state: ev.state };
}

/** The progress after one progress/v1 event (snapshot and seal steps are not Continue's). */
export function applyProgressEvent(
  progress: IContinueProgress,
  ev: IProgressEvent
): IContinueProgress {
  const step = ev.step as ContinueStep;
  if (!STEPS.includes(step)) {
    return progress;
  }
  const current = progress.steps[step];
  return {
    ...progress,
    steps: {
      ...progress.steps,
      [step]: {
        status: current.status === 'pending' ? 'running' : current.status,
        message: ev.message ?? current.message,
        done: ev.done ?? null,
        total: ev.total ?? null
      }
    }
  };
}

/**
 * The progress as the stored lifecycle tells it. When it adds nothing to ``previous``
 * (same Continue, no newer event), ``previous`` is kept, with its step messages.
 */
export function progressFromLifecycle(
  lifecycle: ILifecycle,
  previous: IContinueProgress = idleProgress()
): IContinueProgress {
  const events = [...(lifecycle.events ?? [])].sort((a, b) => a.seq - b.seq);
  const last = events.length ? events[events.length - 1].seq : 0;
  if (last <= previous.seq) {
    return previous;
  }
  let startIndex = -1;
  for (let i = events.length - 1; i >= 0; i--) {
    const ev = events[i];
    if (ev.state === 'ROUTING' && (ev.previous === null || CONTINUE_FROM.has(ev.previous))) {
      startIndex = i;
      break;
    }
  }
  let base = previous;
  if (startIndex < 0 || events[startIndex].seq !== previous.startSeq) {
    base = idleProgress();
  }
  let p = base;
  const from = startIndex < 0 ? events.length : startIndex;
  for (const ev of events.slice(from)) {
    p = applyStateEvent(p, ev);
  }
  return p.seq >= last ? p : { ...idleProgress(last), state: lifecycle.state };
}

/** A step's completion as a fraction (0..1), or null when its size is unknown. */
export function stepFraction(step: IStepProgress): number | null {
  if (step.status === 'done') {
    return 1;
  }
  if (step.total && step.total > 0 && step.done !== null) {
    return Math.min(1, Math.max(0, step.done / step.total));
  }
  return null;
}
