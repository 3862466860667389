import {
  IBudgetSettings,
  ICalendar,
  ICalendarSlot,
  IRequirements,
  IRoute,
  IWorkspaceSettings
} from '../types';

/** A route as the server prints one, with the given overrides. */
export function route(over: Partial<IRoute> & { id: string }): IRoute {
  const cost = { gpu: 10, egress: 1, storage: 0.1, queue: 0.5, risk: 0.4, total: 12, ...(over.cost ?? {}) };
  return {
    provider: 'local',
    offer: over.id,
    gpu: 'A100-SXM4-80GB',
    gpu_count: 1,
    region: 'local-1',
    price_per_hour: 1.25,
    time_to_ready_s: 60,
    checks: { listed: true, permitted: true, capacity: null, launched: null },
    blocked: null,
    reasons: {},
    ...over,
    cost
  };
}

export const H = 3600 * 1000;

/** A calendar from ``start`` for ``days`` days of one-hour slots; ``edit`` may change slots. */
export function calendar(
  start: string,
  days: number,
  offers: { [key: string]: { capacity: number | null; edit?: (i: number, slot: ICalendarSlot) => void } }
): ICalendar {
  const t0 = Date.parse(start);
  const out: ICalendar = { start, days, slot_hours: 1, offers: {} };
  for (const [key, spec] of Object.entries(offers)) {
    const slots: ICalendarSlot[] = [];
    for (let i = 0; i < days * 24; i++) {
      const slot: ICalendarSlot = {
        start: new Date(t0 + i * H).toISOString().replace('.000Z', 'Z'),
        free: spec.capacity,
        taken: 0,
        mine: []
      };
      spec.edit?.(i, slot);
      slots.push(slot);
    }
    out.offers[key] = {
      capacity: spec.capacity,
      guarantee: spec.capacity === null ? 'best-effort' : 'capacity-checked',
      guarantee_text: spec.capacity === null ? 'Best effort: (the server\'s words)' : 'Capacity-checked: (the server\'s words)',
      slots
    };
  }
  return out;
}

/** GET settings of a workspace nobody has configured, with the given fields set. */
export function settingsAnswer(
  over: {
    requirements?: Partial<IRequirements>;
    budget?: Partial<IBudgetSettings>;
    hours?: number;
    autosnapshot_minutes?: number | null;
    idle_minutes?: number;
  } = {}
): IWorkspaceSettings {
  return {
    hours: 8,
    autosnapshot_minutes: null,
    idle_minutes: 30,
    ...over,
    requirements: {
      gpus: [],
      gpu_count: 1,
      min_gpu_memory_gb: 0,
      driver: null,
      min_cuda: null,
      container_image: null,
      machine_image: null,
      max_price_per_hour: null,
      regions: [],
      ...over.requirements
    },
    budget: { max_price_per_hour: null, total: null, warn_fraction: 0.8, ...over.budget }
  };
}
