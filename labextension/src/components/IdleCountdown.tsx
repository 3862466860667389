import React, { useEffect, useState } from 'react';

import { PortableApiError, PortableClient } from '../api';
import { PortableModel } from '../model';
import { IIdle } from '../types';
import { ApiErrorLine } from './common';

/** How often a countdown on screen is redrawn. */
export const COUNTDOWN_TICK_MS = 1000;

/** What the idle line says: a countdown in the last warn_s seconds, or what an idle stop did. */
export interface IIdleLine {
  kind: 'countdown' | 'released';
  text: string;
  left?: string;
}

/** m:ss of ``seconds`` (never negative). */
export function clock(seconds: number): string {
  const s = Math.max(0, Math.ceil(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

/**
 * The line to show for ``idle`` answered ``elapsedMs`` ago, or null: the server's remaining_s
 * counts down in the browser between two answers, so no clock of the browser's is compared
 * with the server's.
 */
export function idleLine(idle: IIdle | null | undefined, elapsedMs: number): IIdleLine | null {
  if (!idle) {
    return null;
  }
  if (idle.state === 'released' && idle.released) {
    return { kind: 'released', text: idle.released.message };
  }
  if ((idle.state !== 'warning' && idle.state !== 'stop') || idle.remaining_s === null) {
    return null;
  }
  const left = idle.remaining_s - Math.max(0, elapsedMs) / 1000;
  if (left > idle.warn_s) {
    return null;
  }
  return {
    kind: 'countdown',
    left: clock(left),
    text:
      left > 0
        ? `No cell has run and the GPU has been idle: this machine is sealed and released in ${clock(left)}`
        : 'Idle: sealing and releasing this machine'
  };
}

/** The idle countdown with "Keep running", and afterwards what the idle stop saved. */
export function IdleCountdown(props: { model: PortableModel; now: number }): JSX.Element | null {
  const { model } = props;
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<PortableApiError | null>(null);
  // the sidebar redraws every few seconds; a countdown on screen redraws itself every second
  const [tick, setTick] = useState(() => Date.now());
  const now = Math.max(props.now, tick);
  const line = idleLine(model.state?.idle, now - model.fetchedAt);
  const counting = line?.kind === 'countdown';
  useEffect(() => {
    if (!counting) {
      return;
    }
    const timer = window.setInterval(() => setTick(Date.now()), COUNTDOWN_TICK_MS);
    return () => window.clearInterval(timer);
  }, [counting]);
  if (!line) {
    return null;
  }
  if (line.kind === 'released') {
    return (
      <p className="jp-Portable-idle jp-Portable-idleReleased" role="status">
        {line.text}
      </p>
    );
  }
  const keep = async (): Promise<void> => {
    setBusy(true);
    setError(null);
    try {
      await new PortableClient().keepRunning();
      await model.refreshState();
    } catch (e) {
      setError(e instanceof PortableApiError ? e : new PortableApiError(String(e), null, null, 'keep-running'));
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="jp-Portable-idle" role="alert" aria-live="polite">
      <span className="jp-Portable-idleText">{line.text}</span>{' '}
      <button type="button" className="jp-Portable-button" disabled={busy} onClick={() => void keep()}>
        Keep running
      </button>
      <ApiErrorLine error={error} />
    </div>
  );
}
