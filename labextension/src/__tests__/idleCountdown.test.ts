import { describe, expect, it } from 'vitest';

import { clock, idleLine } from '../components/IdleCountdown';
import { IIdle } from '../types';

const idle = (over: Partial<IIdle>): IIdle => ({
  state: 'idle',
  minutes: 30,
  idle_since: '2026-12-01T09:00:00.000Z',
  stop_at: '2026-12-01T09:30:00.000Z',
  remaining_s: 1200,
  warn_s: 300,
  released: null,
  ...over
});

describe('the idle countdown', () => {
  it('shows nothing until the last five minutes, then counts down from the answer', () => {
    expect(idleLine(idle({}), 0)).toBeNull();
    expect(idleLine(idle({ state: 'busy', remaining_s: null }), 0)).toBeNull();
    expect(idleLine(idle({ state: 'off', remaining_s: null }), 0)).toBeNull();
    expect(idleLine(null, 0)).toBeNull();
    const line = idleLine(idle({ state: 'warning', remaining_s: 272 }), 0);
    expect(line).toMatchObject({ kind: 'countdown', left: '4:32' });
    expect(line?.text).toContain('sealed and released in 4:32');
    expect(idleLine(idle({ state: 'warning', remaining_s: 272 }), 12_000)?.left).toBe('4:20');
    expect(idleLine(idle({ state: 'warning', remaining_s: 5 }), 9_000)?.text).toBe(
      'Idle: sealing and releasing this machine'
    );
  });

  it('says afterwards what happened and what it saves', () => {
    const message = 'Released after 30 min idle; saves about $1.35/h from now on';
    const released = idle({
      state: 'released',
      remaining_s: null,
      released: {
        allocation_id: 'al-1',
        route: 'r-0123456789',
        minutes: 30,
        at: '2026-12-01T09:30:00.000Z',
        idle_since: '2026-12-01T09:00:00.000Z',
        saved_per_hour: 1.35,
        message
      }
    });
    expect(idleLine(released, 0)).toEqual({ kind: 'released', text: message });
  });

  it('writes minutes and seconds', () => {
    expect(clock(0)).toBe('0:00');
    expect(clock(59.2)).toBe('1:00');
    expect(clock(300)).toBe('5:00');
    expect(clock(-3)).toBe('0:00');
  });
});
