/**
 * The shapes the server extension answers with (docs/api.md), as the sidebar reads them.
 *
 * Plain types only: nothing here imports JupyterLab, so the logic modules that use them
 * run under vitest in node.
 */

/** Every state of the Continue state machine (jupyter_portable/core/lifecycle.py). */
export type LifecycleState =
  | 'IDLE'
  | 'ACTIVE'
  | 'DRAINING'
  | 'SEALED'
  | 'RELEASED'
  | 'LOST'
  | 'ROUTING'
  | 'ACQUIRING'
  | 'PROBING'
  | 'MATERIALIZING'
  | 'VERIFYING'
  | 'READY'
  | 'FAILED';

/** The states a Continue may begin from. */
export const CONTINUE_FROM: ReadonlySet<string> = new Set([
  'IDLE',
  'LOST',
  'RELEASED',
  'FAILED'
]);

/** The states of a Continue in flight. */
export const CONTINUE_STATES: ReadonlySet<string> = new Set([
  'ROUTING',
  'ACQUIRING',
  'PROBING',
  'MATERIALIZING',
  'VERIFYING',
  'READY'
]);

export interface IWorkspaceInfo {
  id: string;
  name: string;
  store: string;
  path: string;
}

/** One lifecycle transition, as stored and as emitted on the state/v1 schema. */
export interface ILifecycleEvent {
  seq: number;
  state: LifecycleState;
  previous: LifecycleState | null;
  reason: string | null;
  allocation_id: string | null;
  route: string | null;
  version: number;
  verified: boolean;
  at: string;
  detail?: { [key: string]: unknown } | null;
}

/** A route given up on in this Continue: at least its reason. */
export interface IAttempt {
  reason: string;
  route?: string | null;
  [key: string]: unknown;
}

export interface ILifecycle {
  state: LifecycleState;
  allocation_id: string | null;
  route: string | null;
  version: number;
  verified: boolean;
  epoch: number;
  updated: string;
  attempts: IAttempt[];
  events: ILifecycleEvent[];
}

export interface IAllocation {
  allocation_id: string;
  provider: string;
  offer: string;
  gpu: string;
  gpu_count: number;
  driver: string | null;
  region: string | null;
  price_per_hour: number;
  spend: number;
  started: string | null;
  uptime_s: number | null;
}

export interface ILost {
  reason: string;
  at: string | null;
}

export interface ISnapshotInfo {
  version: number;
  created: string;
  files: number;
  bytes: number;
  message: string | null;
}

export interface ICheckpoint {
  path: string;
  step: number | null;
  note: string | null;
  hash: string | null;
  size: number | null;
  format: string | null;
  verified: boolean;
  reason: string | null;
  version: number | null;
  created: string | null;
}

export interface IBudget {
  spent: number;
  cap?: number | null;
  state: string;
  message?: string | null;
}

export interface IConflict {
  path: string;
  at: string;
  kept: string;
}

/** GET /portable/api/state */
export interface IPortableState {
  workspace: IWorkspaceInfo;
  lifecycle: ILifecycle;
  allocation: IAllocation | null;
  lost: ILost | null;
  continuing: boolean;
  snapshot: ISnapshotInfo | null;
  checkpoints: ICheckpoint[];
  budget: IBudget | null;
  conflicts: IConflict[];
}

/** The cost terms, in dollars, in the order the table and the chart show them. */
export const COST_TERMS = ['gpu', 'egress', 'storage', 'queue', 'risk'] as const;
export type CostTerm = (typeof COST_TERMS)[number];

export type ICost = { [K in CostTerm]: number } & { total: number };

/** The four separate checks: true or false when done, null when not done. */
export const CHECK_NAMES = [
  'listed',
  'permitted',
  'capacity',
  'launched'
] as const;
export type CheckName = (typeof CHECK_NAMES)[number];
export type IChecks = { [K in CheckName]: boolean | null };

/** One route, as `jupyter portable routes --json` prints it. */
export interface IRoute {
  id: string;
  provider: string;
  offer: string;
  gpu: string;
  gpu_count: number;
  region: string | null;
  price_per_hour: number;
  cost: ICost;
  time_to_ready_s: number;
  checks: IChecks;
  blocked: string | null;
  reasons: { [key: string]: string };
  breakdown?: string[];
}

/** GET /portable/api/routes */
export interface IRoutesAnswer {
  routes: IRoute[];
  best: string | null;
  hours: number;
}

export type ChargePolicy = 'now' | 'before';
export type Guarantee = 'provider' | 'capacity-checked' | 'best-effort';

/** A reservation (jupyter_portable/core/calendar.py Booking.to_json). */
export interface IBooking {
  reservation_id: string;
  offer_key: string;
  start: string;
  hours: number;
  charge: ChargePolicy;
  guarantee: Guarantee;
  price: number;
  status: 'booked' | 'cancelled' | 'charged';
  created: string;
  charge_at: string;
  refund: number | null;
}

export interface ICalendarSlot {
  start: string;
  /** Capacity left in the slot; null where capacity is unknown (best-effort). */
  free: number | null;
  taken: number;
  /** The reservation ids in the slot. */
  mine: string[];
}

export interface ICalendarOffer {
  capacity: number | null;
  guarantee: Guarantee;
  slots: ICalendarSlot[];
}

export interface ICalendar {
  start: string;
  days: number;
  slot_hours: number;
  offers: { [offerKey: string]: ICalendarOffer };
}

/** GET /portable/api/reservations */
export interface IReservationsAnswer {
  reservations: IBooking[];
  calendar: ICalendar;
}

/** POST /portable/api/reservations */
export interface IBookingRequest {
  offer: string;
  start: string;
  hours: number;
  charge: ChargePolicy;
}

export const STATE_SCHEMA = 'https://events.jupyter-portable.org/state/v1';
export const PROGRESS_SCHEMA = 'https://events.jupyter-portable.org/progress/v1';
export const NOTICE_SCHEMA = 'https://events.jupyter-portable.org/notice/v1';

export interface IStateEvent extends ILifecycleEvent {
  workspace_id: string;
}

export type ProgressStep =
  | 'acquire'
  | 'probe'
  | 'materialize'
  | 'verify'
  | 'reconnect'
  | 'snapshot'
  | 'seal';

export interface IProgressEvent {
  workspace_id: string;
  step: ProgressStep;
  message: string;
  done: number | null;
  total: number | null;
}

export type NoticeKind = 'lost' | 'ready' | 'failed' | 'conflict' | 'budget';

export interface INoticeEvent {
  workspace_id: string;
  kind: NoticeKind;
  message: string;
}

/** The user's settings (schema/plugin.json). */
export interface IPortableSettings {
  storeUrl: string;
  budgetCap: number | null;
  pinnedDriver: string;
  /** 0: off; null: the machine's default. */
  autoSnapshotMinutes: number | null;
  plannedHours: number;
}

export const DEFAULT_SETTINGS: IPortableSettings = {
  storeUrl: '',
  budgetCap: null,
  pinnedDriver: '',
  autoSnapshotMinutes: null,
  plannedHours: 8
};
