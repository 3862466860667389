/**
 * The route table's logic: order, the best choice, why a route is blocked, which checks
 * were done, and the stacked bars of the cost chart. Pure functions over IRoute.
 *
 * The server ranks routes (core/routing.py rank_routes: unblocked by total, an offer preempted
 * repeatedly in the last hour after a route within the margin, blocked ones last) and marks the
 * best; the order here is the server's ``rank``, and the order it sent them in where it gave
 * none, never a ranking of the browser's own, so a table sorted by the user on another column
 * can always be put back.
 */

import { CHECK_NAMES, ICost, IRoute, IRoutesAnswer, PROVIDER_NAME, REASON_CATEGORY } from './types';

/** The cost terms, in dollars, in the order the table and the chart show them. */
export const COST_TERMS = ['gpu', 'egress', 'storage', 'queue', 'risk'] as const satisfies readonly (keyof ICost)[];
export type CostTerm = (typeof COST_TERMS)[number];

/** The four separate checks: true or false when done, null when not done. */
// The four checks, in the order the server makes them (generated: core/offers.py Checks).
export { CHECK_NAMES };
export type CheckName = (typeof CHECK_NAMES)[number];

export type SortKey = 'rank' | 'total' | 'ready' | 'price' | CostTerm;

/** The server's order: its rank; routes it gave no rank keep their place (the sort is stable). */
function rankCompare(a: IRoute, b: IRoute): number {
  return a.rank && b.rank ? a.rank - b.rank : 0;
}

function sortValue(route: IRoute, key: SortKey): number {
  switch (key) {
    case 'total':
    case 'rank':
      return route.cost.total;
    case 'ready':
      return route.time_to_ready_s;
    case 'price':
      return route.price_per_hour;
    default:
      return route.cost[key];
  }
}

/**
 * The routes in table order. Blocked routes always stay below the unblocked ones, so that
 * sorting by a column never puts a route that cannot be taken at the top.
 */
export function sortRoutes(
  routes: readonly IRoute[],
  key: SortKey = 'rank',
  descending = false
): IRoute[] {
  const sign = descending ? -1 : 1;
  return [...routes].sort((a, b) => {
    const blocked = Number(a.blocked !== null) - Number(b.blocked !== null);
    if (blocked !== 0) {
      return blocked;
    }
    if (key !== 'rank') {
      const diff = sign * (sortValue(a, key) - sortValue(b, key));
      if (diff !== 0) {
        return diff;
      }
    }
    return rankCompare(a, b);
  });
}

/** Whether the route can be chosen for Continue. */
export function isTakeable(route: IRoute): boolean {
  return route.blocked === null;
}

/**
 * The route to preselect: the server's ``best`` when it names a takeable route, else the
 * first takeable one in the server's order, else null (every route blocked).
 */
export function bestRoute(answer: IRoutesAnswer | null): IRoute | null {
  if (!answer) {
    return null;
  }
  const named = answer.routes.find(r => r.id === answer.best);
  if (named && isTakeable(named)) {
    return named;
  }
  return sortRoutes(answer.routes).find(isTakeable) ?? null;
}

/**
 * The route to keep selected after the routes are fetched again: the user's choice while
 * it is still there and takeable, else the best one.
 */
export function keepSelection(
  selected: string | null,
  answer: IRoutesAnswer | null
): string | null {
  if (selected && answer) {
    const route = answer.routes.find(r => r.id === selected);
    if (route && isTakeable(route)) {
      return route.id;
    }
  }
  return bestRoute(answer)?.id ?? null;
}

/** What kind of thing blocks a route. */
export type BlockCategory = 'cap' | 'admission' | 'capacity' | 'other';

// What kind of thing each reason key is: the server's (core/routing.py REASON_CATEGORY, generated).
const CATEGORY: { readonly [key: string]: BlockCategory } = REASON_CATEGORY;

export const CATEGORY_LABEL: { [K in BlockCategory]: string } = {
  cap: 'over a cap',
  admission: 'does not meet the requirements',
  capacity: 'not available',
  other: 'blocked'
};

export interface IBlockReason {
  key: string;
  category: BlockCategory;
  text: string;
}

/**
 * Why a route is blocked, one line per reason, caps first, then admission, then
 * availability. A route blocked without keyed reasons still shows its ``blocked`` text.
 */
export function blockReasons(route: IRoute): IBlockReason[] {
  const order: BlockCategory[] = ['cap', 'admission', 'capacity', 'other'];
  const out = Object.entries(route.reasons ?? {}).map(([key, text]) => ({
    key,
    category: CATEGORY[key] ?? 'other',
    text
  }));
  out.sort(
    (a, b) =>
      order.indexOf(a.category) - order.indexOf(b.category) ||
      (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)
  );
  if (out.length === 0 && route.blocked) {
    out.push({ key: 'blocked', category: 'other', text: route.blocked });
  }
  return out;
}

/** The categories a route is blocked for, in display order, without repeats. */
export function blockCategories(route: IRoute): BlockCategory[] {
  return [...new Set(blockReasons(route).map(r => r.category))];
}

export type CheckStatus = 'passed' | 'failed' | 'not-done';

export interface ICheckRow {
  name: CheckName;
  status: CheckStatus;
  label: string;
}

const CHECK_LABEL: { [K in CheckName]: string } = {
  listed: 'listed',
  permitted: 'permitted',
  capacity: 'capacity now',
  launched: 'launched'
};

/** The four checks in order, each passed, failed or not done. */
export function checkRows(route: IRoute): ICheckRow[] {
  return CHECK_NAMES.map(name => {
    const value = route.checks?.[name];
    const status: CheckStatus =
      value === true ? 'passed' : value === false ? 'failed' : 'not-done';
    return { name, status, label: CHECK_LABEL[name] };
  });
}

/** "2 of 4 checks done: listed passed, permitted passed, capacity now not done, launched not done". */
export function checksSummary(route: IRoute): string {
  const rows = checkRows(route);
  const done = rows.filter(r => r.status !== 'not-done').length;
  const parts = rows.map(
    r => `${r.label} ${r.status === 'not-done' ? 'not done' : r.status}`
  );
  return `${done} of ${rows.length} checks done: ${parts.join(', ')}`;
}

export interface ISegment {
  term: CostTerm;
  value: number;
  /** Offset and width as fractions of the largest total (0..1). */
  x: number;
  width: number;
}

export interface IBar {
  route: IRoute;
  total: number;
  segments: ISegment[];
}

/**
 * One stacked bar per route, scaled so the dearest route fills the width. Negative or
 * missing terms count as 0; a zero-width segment is left out.
 */
export function costBars(routes: readonly IRoute[]): IBar[] {
  const totals = routes.map(r =>
    COST_TERMS.reduce((sum, t) => sum + Math.max(0, r.cost[t] ?? 0), 0)
  );
  const scale = Math.max(0, ...totals);
  return routes.map((route, i) => {
    let x = 0;
    const segments: ISegment[] = [];
    for (const term of COST_TERMS) {
      const value = Math.max(0, route.cost[term] ?? 0);
      if (value <= 0 || scale <= 0) {
        continue;
      }
      const width = value / scale;
      segments.push({ term, value, x, width });
      x += width;
    }
    return { route, total: totals[i], segments };
  });
}

/** "local · A100-SXM4-80GB x1 · local-1": a route as one line. */
export function routeLabel(route: IRoute): string {
  const gpu = route.gpu_count > 1 ? `${route.gpu} x${route.gpu_count}` : route.gpu;
  return [route.provider, gpu, route.region].filter(Boolean).join(' · ');
}

/** Providers by the names their users know them by (generated: compute/registry.py PROVIDER_NAME). */
export { PROVIDER_NAME };

export function providerName(provider: string | null | undefined): string {
  const names: { readonly [name: string]: string } = PROVIDER_NAME;
  return provider ? (names[provider] ?? provider) : '—';
}

/** "NVIDIA A100 80GB · RunPod · EU-RO-1": a machine in words, GPU first. */
export function machineName(m: {
  gpu?: string | null;
  gpu_count?: number | null;
  provider?: string | null;
  region?: string | null;
  offer?: string | null;
}): string {
  const gpu = m.gpu ? ((m.gpu_count ?? 1) > 1 ? `${m.gpu} x${m.gpu_count}` : m.gpu) : (m.offer ?? 'a machine');
  return [gpu, providerName(m.provider), m.region].filter(Boolean).join(' · ');
}

/** A route in words, GPU first. */
export function routeName(route: IRoute): string {
  return machineName(route);
}

/** An offer key ("local/a100") in words, from the routes that list it; the key when none does. */
export function offerName(key: string, routes: readonly IRoute[] | null | undefined): string {
  const route = routes?.find(r => `${r.provider}/${r.offer}` === key);
  return route ? routeName(route) : key;
}

/** The checks in words: "capacity checked, not launched". */
export function checksInWords(route: IRoute): string {
  const c = route.checks ?? { listed: true, permitted: null, capacity: null, launched: null };
  if (c.launched === true) {
    return 'launched and checked';
  }
  if (c.launched === false) {
    return 'a launch of it failed';
  }
  if (c.capacity === false) {
    return 'checked: no capacity now';
  }
  if (c.permitted === false) {
    return 'not permitted (credentials or quota)';
  }
  if (c.capacity === true) {
    return 'capacity checked, not launched';
  }
  if (c.permitted === true) {
    return 'permitted; capacity not checked, not launched';
  }
  return c.listed === false ? 'no longer listed' : 'listed only: capacity not checked, not launched';
}

/** "0.4 h", "<0.1 h": time lost, rounded as the server rounds it. */
export function hoursLost(hours: number): string {
  return hours > 0 && hours < 0.05 ? '<0.1 h' : `${hours.toFixed(1)} h`;
}

/**
 * "8% chance of a failed launch or a lost machine in the 8 planned h: 0.4 h lost, $0.40
 * expected", and what recently happened to the offer.
 */
export function riskInWords(route: IRoute, money: (x: number) => string, hours?: number | null): string {
  const p = route.p_fail ?? 0;
  const pct = p > 0 && p < 0.005 ? '<1' : String(Math.round(p * 100));
  const history = route.history?.length ? ` (${route.history.join(', ')})` : '';
  const within = hours ? ` in the ${hours} planned h` : ' in the planned hours';
  const lost = route.risk ? `${hoursLost(route.risk.hours)} lost, ` : '';
  return `${pct}% chance of a failed launch or a lost machine${within}: ${lost}${money(route.cost.risk)} expected${history}`;
}

/**
 * "A lost machine costs 2 s to notice, 60 s to Continue again and 5 min of work since the last
 * verified checkpoint, on average (the last is 4 min old, one every ~10 min)": core/routing.py's risk_words.
 */
export function lossInWords(route: IRoute, duration: (s: number) => string): string | null {
  const r = route.risk;
  if (!r) {
    return null;
  }
  const age = r.checkpoint_age_s ?? null;
  const every = r.checkpoint_every_s ?? null;
  const checkpoint =
    age === null ? 'no verified checkpoint yet' : `the last is ${duration(age)} old` + (every ? `, one every ~${duration(every)}` : '');
  return (
    `A lost machine costs ${duration(r.notice_s)} to notice, ${duration(r.again_s)} to Continue again ` +
    `and ${duration(r.work_s)} of work since the last verified checkpoint, on average (${checkpoint})`
  );
}

/** Each cost term's one-line definition, for the legend and the cards. */
export const TERM_LABEL: { [K in CostTerm | 'total']: string } = {
  gpu: 'GPU',
  egress: 'Transfer',
  storage: 'Storage',
  queue: 'Queue',
  risk: 'Risk',
  total: 'Total'
};

const TERM_DEFINITION: { [K in CostTerm | 'total']: string } = {
  gpu: 'GPU: its price per hour for the planned hours',
  egress: 'Transfer: moving the workspace from the store to the machine',
  storage: 'Storage: keeping the workspace in the store for the planned hours',
  queue: "Queue: the expected wait before the machine starts, priced at this GPU's rate (no one bills it)",
  risk:
    'Risk: the chance of a failed launch or a lost machine times what it costs you: the time to notice, ' +
    'to Continue again and to redo the work since the last verified checkpoint, at the route’s rate (no one bills it)',
  total: 'Total: the whole cost of getting to the next verified state; caps and the budget are held to it'
};

/** The definition of ``term`` for ``route`` in its own numbers when the server gave them. */
export function termWords(term: CostTerm | 'total', route?: IRoute | null): string {
  return route?.words?.[term] ?? TERM_DEFINITION[term];
}
