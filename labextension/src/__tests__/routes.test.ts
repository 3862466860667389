import { describe, expect, it } from 'vitest';

import {
  bestRoute,
  blockCategories,
  blockReasons,
  checkRows,
  checksSummary,
  costBars,
  keepSelection,
  routeLabel,
  sortRoutes
} from '../routes';
import { route } from './fixtures';

const cheap = route({ id: 'r-cheap', cost: { gpu: 4, egress: 1, storage: 0, queue: 0, risk: 0, total: 5 } });
const dear = route({ id: 'r-dear', cost: { gpu: 20, egress: 2, storage: 0, queue: 1, risk: 1, total: 24 } });
const mid = route({ id: 'r-mid', time_to_ready_s: 30, cost: { gpu: 8, egress: 1, storage: 0, queue: 1, risk: 0, total: 10 } });
const midSlow = route({ id: 'r-mid-slow', time_to_ready_s: 900, cost: { gpu: 8, egress: 1, storage: 0, queue: 1, risk: 0, total: 10 } });
const overCap = route({
  id: 'r-over',
  cost: { gpu: 1, egress: 0, storage: 0, queue: 0, risk: 0, total: 1 },
  blocked: '$9.00/h is over the cap of $5.00/h',
  reasons: { price_cap: '$9.00/h is over the cap of $5.00/h' }
});
const noCapacity = route({
  id: 'r-full',
  blocked: 'no capacity now; lists driver 535.1, 550.54.15 is pinned',
  reasons: { capacity: 'no capacity now', driver: 'lists driver 535.1, 550.54.15 is pinned' },
  checks: { listed: true, permitted: true, capacity: false, launched: null }
});

describe('route table order', () => {
  it("keeps the server's order, and never puts a blocked route above a takeable one", () => {
    // the server's ranking is the order it sent, where it gave no rank: the browser ranks nothing
    const order = sortRoutes([mid, dear, overCap, cheap, midSlow, noCapacity]).map(r => r.id);
    expect(order).toEqual(['r-mid', 'r-dear', 'r-cheap', 'r-mid-slow', 'r-over', 'r-full']);
  });

  it('keeps a blocked route below the takeable ones whatever column is sorted', () => {
    // r-over is the cheapest by every term, but it cannot be taken.
    const byGpu = sortRoutes([dear, overCap, cheap], 'gpu').map(r => r.id);
    expect(byGpu).toEqual(['r-cheap', 'r-dear', 'r-over']);
    const byTotalDesc = sortRoutes([cheap, overCap, dear], 'total', true).map(r => r.id);
    expect(byTotalDesc).toEqual(['r-dear', 'r-cheap', 'r-over']);
  });

  it('sorts by time to Ready when asked', () => {
    expect(sortRoutes([midSlow, cheap, mid], 'ready').map(r => r.id)).toEqual(['r-mid', 'r-cheap', 'r-mid-slow']);
    // ties keep the server's order
    expect(sortRoutes([midSlow, mid], 'total').map(r => r.id)).toEqual(['r-mid-slow', 'r-mid']);
  });

  it("follows the server's rank: a route preempted repeatedly goes after the one within the margin", () => {
    const demoted = route({
      id: 'r-spot',
      rank: 2,
      demoted: 'Not marked best: preempted 3 times in the last hour, and …',
      cost: { gpu: 8, egress: 0, storage: 0, queue: 0, risk: 0.2, total: 8.2 }
    });
    const safe = route({ id: 'r-safe', rank: 1, cost: { gpu: 11, egress: 0, storage: 0, queue: 0, risk: 0, total: 11.2 } });
    const later = route({ id: 'r-later', rank: 3, cost: { gpu: 12, egress: 0, storage: 0, queue: 0, risk: 0, total: 12 } });
    expect(sortRoutes([demoted, later, safe]).map(r => r.id)).toEqual(['r-safe', 'r-spot', 'r-later']);
    // a column sort still sorts by that column
    expect(sortRoutes([safe, later, demoted], 'total').map(r => r.id)).toEqual(['r-spot', 'r-safe', 'r-later']);
    expect(bestRoute({ routes: [demoted, safe, later], best: null, hours: 8 })?.id).toBe('r-safe');
  });

  it('does not change the array it was given', () => {
    const given = [dear, cheap];
    sortRoutes(given);
    expect(given.map(r => r.id)).toEqual(['r-dear', 'r-cheap']);
  });
});

describe('the best route', () => {
  it("is the server's best when it can be taken", () => {
    expect(bestRoute({ routes: [cheap, mid], best: 'r-mid', hours: 8 })?.id).toBe('r-mid');
  });

  it("is the first takeable route in the server's order when it names none, or a blocked one", () => {
    expect(bestRoute({ routes: [dear, cheap], best: null, hours: 8 })?.id).toBe('r-dear');
    expect(bestRoute({ routes: [overCap, dear, cheap], best: 'r-over', hours: 8 })?.id).toBe('r-dear');
  });

  it('is none when every route is blocked', () => {
    expect(bestRoute({ routes: [overCap, noCapacity], best: null, hours: 8 })).toBeNull();
    expect(bestRoute(null)).toBeNull();
  });

  it("keeps the user's choice across a refresh while it can still be taken", () => {
    const answer = { routes: [cheap, dear], best: 'r-cheap', hours: 8 };
    expect(keepSelection('r-dear', answer)).toBe('r-dear');
    expect(keepSelection('r-gone', answer)).toBe('r-cheap');
    const nowBlocked = { routes: [cheap, { ...dear, blocked: 'no capacity now', reasons: { capacity: 'no capacity now' } }], best: 'r-cheap', hours: 8 };
    expect(keepSelection('r-dear', nowBlocked)).toBe('r-cheap');
  });
});

describe('why a route is blocked', () => {
  it('names the cap for a route over the price cap', () => {
    expect(blockReasons(overCap)).toEqual([
      { key: 'price_cap', category: 'cap', text: '$9.00/h is over the cap of $5.00/h' }
    ]);
    expect(blockCategories(overCap)).toEqual(['cap']);
  });

  it('lists admission before capacity, each with its own text', () => {
    const reasons = blockReasons(noCapacity);
    expect(reasons.map(r => [r.category, r.text])).toEqual([
      ['admission', 'lists driver 535.1, 550.54.15 is pinned'],
      ['capacity', 'no capacity now']
    ]);
  });

  it('counts the budget as a cap and an unknown key as other', () => {
    const r = route({ id: 'r-b', blocked: 'x; y', reasons: { budget: '$60.00 projected for 8 h is over the $50.00 left', weird: 'y' } });
    expect(blockReasons(r).map(x => x.category)).toEqual(['cap', 'other']);
  });

  it('still shows the blocked text when the server gave no keyed reasons', () => {
    const r = route({ id: 'r-x', blocked: 'refused by the provider', reasons: {} });
    expect(blockReasons(r)).toEqual([{ key: 'blocked', category: 'other', text: 'refused by the provider' }]);
  });

  it('has no reasons for a takeable route', () => {
    expect(blockReasons(cheap)).toEqual([]);
  });
});

describe('the four checks', () => {
  it('says which were done and how they went', () => {
    expect(checkRows(noCapacity).map(c => c.status)).toEqual(['passed', 'passed', 'failed', 'not-done']);
    expect(checksSummary(noCapacity)).toBe(
      '3 of 4 checks done: listed passed, permitted passed, capacity now failed, launched not done'
    );
  });

  it('treats a missing check as not done, never as passed', () => {
    const r = route({ id: 'r-y', checks: { listed: true, permitted: null, capacity: null, launched: null } });
    expect(checksSummary(r).startsWith('1 of 4 checks done')).toBe(true);
  });
});

describe('the cost chart', () => {
  it('stacks the terms in order and scales the dearest route to the full width', () => {
    const [a, b] = costBars([cheap, dear]);
    expect(b.total).toBe(24);
    const widthB = b.segments.reduce((s, seg) => s + seg.width, 0);
    expect(widthB).toBeCloseTo(1);
    expect(a.segments.map(s => s.term)).toEqual(['gpu', 'egress']);
    expect(a.segments[0]).toMatchObject({ x: 0, width: 4 / 24 });
    expect(a.segments[1].x).toBeCloseTo(4 / 24);
    expect(a.total).toBe(5);
  });

  it('draws from the terms, not the total, and ignores negative terms', () => {
    const odd = route({ id: 'r-odd', cost: { gpu: 2, egress: -1, storage: 0, queue: 0, risk: 0, total: 99 } });
    const [bar] = costBars([odd]);
    expect(bar.total).toBe(2);
    expect(bar.segments).toEqual([{ term: 'gpu', value: 2, x: 0, width: 1 }]);
  });

  it('draws nothing for routes that cost nothing', () => {
    const free = route({ id: 'r-free', cost: { gpu: 0, egress: 0, storage: 0, queue: 0, risk: 0, total: 0 } });
    expect(costBars([free])[0].segments).toEqual([]);
  });
});

it('labels a route by provider, GPU and region', () => {
  expect(routeLabel(route({ id: 'r', gpu: 'H100', gpu_count: 8, region: 'us-east-1' }))).toBe('local · H100 x8 · us-east-1');
  expect(routeLabel(route({ id: 'r', region: null }))).toBe('local · A100-SXM4-80GB');
});
