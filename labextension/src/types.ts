/**
 * The shapes of the server extension's REST API (docs/api.md), as the sidebar reads them.
 *
 * GENERATED from the JSON Schemas in jupyter_portable/interfaces/serverext/schemas/:
 *   cancel.json
 *   checkpoints.json
 *   continue-request.json
 *   continue.json
 *   error.json
 *   files.json
 *   orphan-terminate.json
 *   orphans.json
 *   reservation-request.json
 *   reservation.json
 *   reservations.json
 *   routes.json
 *   settings-request.json
 *   settings.json
 *   snapshot-request.json
 *   snapshot.json
 *   state.json
 *   stop.json
 * Do not edit: change a schema, then run `jlpm gen:types` in labextension/.
 */

/**
 * Every state of the Continue state machine (jupyter_portable/core/lifecycle.py).
 */
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
/**
 * now: charged at booking; before: charged automatically 2 h before the start.
 */
export type ChargePolicy = 'now' | 'before';
export type Guarantee = 'provider' | 'capacity-checked' | 'best-effort';
/**
 * POST /portable/api/cancel: whether a running Continue was told to stop at its next step.
 */
export interface ICancelAnswer {
  cancelled: boolean;
}
/**
 * GET /portable/api/checkpoints: the head version's checkpoints and the latest verified one.
 */
export interface ICheckpointsAnswer {
  checkpoints: ICheckpoint[];
  latest: ICheckpoint | null;
}
/**
 * One registered checkpoint and the outcome of its write check.
 */
export interface ICheckpoint {
  path: string;
  step: number | null;
  note: string;
  hash: string | null;
  size: number;
  format: string | null;
  verified: boolean;
  status: 'verified' | 'rejected';
  /**
   * Why it was rejected.
   */
  reason: string | null;
  /**
   * The version that published it.
   */
  version: number | null;
  created: string;
}
/**
 * POST /portable/api/continue: the route to take first; null or absent: the best.
 */
export interface IContinueRequest {
  route?: string | null;
}
/**
 * 202 to POST /portable/api/continue: the Continue started; its progress comes as events.
 */
export interface IContinueAnswer {
  started: boolean;
  state: LifecycleState;
}
/**
 * The body of every 4xx answer: a one-line error and, where there is one, how to fix it.
 */
export interface IErrorAnswer {
  error: string;
  hint: string | null;
}
/**
 * GET /portable/api/files: the head version's files; while ACTIVE, what the worker has not published yet.
 */
export interface IFilesAnswer {
  /**
   * The head version; 0 before the first snapshot.
   */
  version: number;
  files: IFileEntry[];
  pending: string[];
  conflicts: IConflict[];
  /**
   * The worker's own answer (or {error}); null unless ACTIVE.
   */
  worker: {
    [k: string]: unknown;
  } | null;
}
export interface IFileEntry {
  path: string;
  size: number;
  hash: string;
}
/**
 * A file both sides changed; the user's side is kept beside it.
 */
export interface IConflict {
  path: string;
  at: string;
  kept: string;
}
/**
 * POST /portable/api/orphans {"terminate": "provider/ref"}: the machine terminated, the state its provider reports afterwards, and the orphans swept again.
 */
export interface IOrphanTerminated {
  provider: string;
  ref: string;
  allocation_id: string | null;
  workspace_id: string | null;
  state: string;
  orphans: IOrphans | null;
}
/**
 * GET /portable/api/orphans (and the state's orphans): the machines the enabled providers hold with our labels that are not the current allocation of a known workspace, as the server's last sweep found them.
 */
export interface IOrphans {
  /**
   * When the sweep listed the machines (ISO 8601, UTC).
   */
  checked_at: string;
  /**
   * A new sweep is running now.
   */
  sweeping: boolean;
  machines: IOrphanMachine[];
  /**
   * One line per provider that could not list its machines.
   */
  problems: string[];
}
/**
 * One rented machine, found by the workspace and allocation ids in its provider's name, labels or tags.
 */
export interface IOrphanMachine {
  provider: string;
  /**
   * The provider's own id of the machine.
   */
  ref: string;
  allocation_id: string | null;
  workspace_id: string | null;
  state: 'pending' | 'running' | 'reachable' | 'stopped' | 'lost' | 'terminated';
  name: string;
  started: string | null;
  uptime_s: number | null;
  price_per_hour: number | null;
  /**
   * Dollars so far.
   */
  spend: number | null;
  /**
   * provider: the provider's own figures (measured); estimate: a listed price x time.
   */
  spend_source: 'provider' | 'estimate' | null;
  /**
   * null: not judged here (another store's workspace).
   */
  orphan: boolean | null;
  why: string;
}
/**
 * POST /portable/api/reservations: book a slot of an offer type; charge defaults to before.
 */
export interface IBookingRequest {
  /**
   * provider/offer-id, e.g. local/a100-80
   */
  offer: string;
  /**
   * An ISO 8601 time.
   */
  start: string;
  hours: number;
  charge?: ChargePolicy;
}
/**
 * A reservation (jupyter_portable/core/calendar.py Booking.to_json): 201 to POST /portable/api/reservations, and the answer to DELETE /portable/api/reservations/<id>.
 */
export interface IBooking {
  /**
   * The booking record's format.
   */
  schema?: 1;
  reservation_id: string;
  /**
   * provider/offer-id
   */
  offer_key: string;
  start: string;
  hours: number;
  charge: ChargePolicy;
  guarantee: Guarantee;
  /**
   * The whole slot's price in dollars.
   */
  price: number;
  status: 'booked' | 'cancelled' | 'charged';
  created: string;
  /**
   * When the price is (or was) charged; null when it will not be.
   */
  charge_at?: string | null;
  /**
   * On a cancelled booking, the dollars given back; null when nothing had been charged.
   */
  refund: number | null;
  /**
   * Whether the user may cancel it now, as the server's rules decide (sent in the reservations listing).
   */
  can_cancel?: boolean;
  /**
   * Why it cannot be cancelled now, when it cannot.
   */
  cancel_refused?: string | null;
}
/**
 * GET /portable/api/reservations?days=7: the workspace's bookings and the calendar of slots.
 */
export interface IReservationsAnswer {
  reservations: IBooking[];
  calendar: ICalendar;
  /**
   * One line for each stored booking that could not be read (it is skipped, never breaks the listing).
   */
  skipped?: string[];
}
export interface ICalendar {
  start: string;
  days: number;
  slot_hours: number;
  /**
   * One row of slots per offer key.
   */
  offers: {
    [k: string]: ICalendarOffer;
  };
}
export interface ICalendarOffer {
  capacity: number | null;
  guarantee: Guarantee;
  slots: ICalendarSlot[];
}
export interface ICalendarSlot {
  start: string;
  /**
   * Capacity left in the slot; null where capacity is unknown (best-effort).
   */
  free: number | null;
  /**
   * The most bookings held at once in the slot.
   */
  taken: number;
  /**
   * The reservation ids in the slot.
   */
  mine: string[];
}
/**
 * GET /portable/api/routes?hours=8: every route, ranked.
 */
export interface IRoutesAnswer {
  routes: IRoute[];
  /**
   * The id of the best open route; null when every route is blocked.
   */
  best: string | null;
  /**
   * The providers that could not list their offers, with why.
   */
  errors?: {
    [k: string]: string;
  };
  /**
   * The hours the routes are priced for; null: the workspace's own.
   */
  hours: number | null;
}
/**
 * One route, as `jupyter portable routes --json` prints it.
 */
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
  /**
   * Why the route is blocked; null when it is open.
   */
  blocked: string | null;
  reasons: {
    [k: string]: string;
  };
  breakdown?: string[];
  /**
   * The chance a launch on this route fails, 0..1, what recently happened to the offer included.
   */
  p_fail?: number;
  /**
   * What recently happened to the offer, in words ("preempted 4 min ago"), newest first.
   */
  history?: string[];
  /**
   * Each cost term's one-line definition in plain words, by term (gpu, egress, storage, queue, risk, total).
   */
  words?: {
    [k: string]: string;
  };
}
/**
 * A route's cost in dollars, term by term.
 */
export interface ICost {
  gpu: number;
  egress: number;
  storage: number;
  queue: number;
  risk: number;
  total: number;
}
/**
 * The four separate checks: true or false when done, null when not done.
 */
export interface IChecks {
  listed: boolean | null;
  permitted: boolean | null;
  capacity: boolean | null;
  launched: boolean | null;
}
/**
 * PUT /portable/api/settings: the fields to change. A field left out or null stays as it is; "" clears it.
 */
export interface ISettingsBody {
  gpus?: string[] | '' | null;
  gpu_count?: number | '' | null;
  min_gpu_memory_gb?: number | '' | null;
  driver?: string | null;
  min_cuda?: string | null;
  image?: string | null;
  max_price_per_hour?: number | '' | null;
  regions?: string[] | '' | null;
  budget_max_price_per_hour?: number | '' | null;
  budget_total?: number | '' | null;
  budget_warn_fraction?: number | '' | null;
  hours?: number | '' | null;
  autosnapshot_minutes?: number | '' | null;
  idle_minutes?: number | '' | null;
}
/**
 * GET and PUT /portable/api/settings: what the workspace needs and may spend, kept with it in its store.
 */
export interface IWorkspaceSettings {
  requirements: IRequirements;
  budget: IBudgetSettings;
  /**
   * The hours routes are priced for.
   */
  hours: number;
  /**
   * The kernel's auto-snapshot on the worker, in minutes (0: off); null: the machine's default.
   */
  autosnapshot_minutes: number | null;
  /**
   * A machine whose kernel ran nothing and whose GPUs did no work for this many minutes is sealed and released (0: never).
   */
  idle_minutes: number;
}
/**
 * What the work needs; an empty list or null admits anything.
 */
export interface IRequirements {
  /**
   * Acceptable GPU models, matched as substrings.
   */
  gpus: string[];
  gpu_count: number;
  min_gpu_memory_gb: number;
  /**
   * An exact driver version, e.g. 550.54.15.
   */
  driver: string | null;
  min_cuda: string | null;
  image: string | null;
  max_price_per_hour: number | null;
  regions: string[];
}
/**
 * A $/h ceiling for any one offer, a total for the workspace, and when to warn.
 */
export interface IBudgetSettings {
  max_price_per_hour: number | null;
  total: number | null;
  warn_fraction: number;
}
/**
 * POST /portable/api/snapshot: the new version's message.
 */
export interface ISnapshotRequest {
  message?: string | null;
}
/**
 * POST /portable/api/snapshot: the version published; changed is false when nothing had changed.
 */
export interface ISnapshotAnswer {
  version: number;
  changed: boolean;
}
/**
 * GET /portable/api/state: what the sidebar shows, in one answer.
 */
export interface IPortableState {
  workspace: IWorkspaceInfo;
  lifecycle: ILifecycle;
  /**
   * The machine serving the workspace, or being launched for it; null when there is none.
   */
  allocation: IAllocation | null;
  /**
   * Why and when the machine was lost; null unless the state is LOST.
   */
  lost: ILost | null;
  /**
   * A Continue is running in this server.
   */
  continuing: boolean;
  /**
   * A Continue may be started now.
   */
  can_continue: boolean;
  /**
   * The running Continue may be cancelled now.
   */
  can_cancel: boolean;
  /**
   * The head version; null before the first snapshot.
   */
  snapshot: ISnapshotInfo | null;
  checkpoints: ICheckpoint[];
  budget: IBudget;
  conflicts: IConflict[];
  /**
   * Idle autostop: the countdown while a machine is active (state idle, warning or busy), or what an idle stop did (state released); null when there is nothing to say.
   */
  idle?: IIdle | null;
  /**
   * Every allocation of this workspace from the store's allocation history (each one's newest record), newest first.
   */
  machines?: IMachine[];
  spend?: ISpend;
  /**
   * The orphans the server's sweep found (machines of ours that no known workspace uses), with Terminate; null until the first sweep.
   */
  orphans?: IOrphans | null;
}
export interface IWorkspaceInfo {
  id: string;
  name: string;
  /**
   * The store's URL.
   */
  store: string;
  /**
   * The workspace's folder on the server.
   */
  path: string;
}
export interface ILifecycle {
  state: LifecycleState;
  allocation_id: string | null;
  route: string | null;
  /**
   * The version the machine was verified at.
   */
  version: number;
  verified: boolean;
  epoch: number;
  updated: string;
  attempts: IAttempt[];
  /**
   * The last 50 events.
   */
  events: ILifecycleEvent[];
}
/**
 * A route given up on in this Continue: at least its reason.
 */
export interface IAttempt {
  reason: string;
  /**
   * The offer's key, provider/offer-id.
   */
  offer?: string;
  stage?: string;
  error?: string;
  checks?: IChecks;
  environment_fault?: boolean;
  allocation_id?: string | null;
  [k: string]: unknown;
}
/**
 * One lifecycle transition, as stored and as emitted on the state/v1 schema.
 */
export interface ILifecycleEvent {
  seq: number;
  at: string;
  state: LifecycleState;
  previous: LifecycleState | null;
  reason: string | null;
  route: string | null;
  allocation_id: string | null;
  epoch?: number;
  /**
   * The version the workspace stands on after this change.
   */
  version: number;
  /**
   * Sent on the state/v1 events only.
   */
  verified?: boolean;
  /**
   * For a failover {given_up, why}; for READY {matched, checkpoints, pending, path}.
   */
  detail?: {
    [k: string]: unknown;
  } | null;
}
/**
 * The machine serving the workspace. While a Continue launches one, `launching` is true and what is not known yet is null.
 */
export interface IAllocation {
  allocation_id: string;
  launching?: boolean;
  provider: string | null;
  offer: string | null;
  gpu: string | null;
  gpu_count?: number;
  driver: string | null;
  region: string | null;
  price_per_hour: number | null;
  /**
   * Dollars spent on it so far.
   */
  spend: number | null;
  started: string | null;
  uptime_s: number | null;
  /**
   * What the route predicted for this machine and, once it was Ready, what was measured (the allocation record's predicted and measured); null for a machine from before estimates were recorded.
   */
  estimate?: IEstimate | null;
}
export interface IEstimate {
  predicted: IPredicted;
  /**
   * null until Ready.
   */
  measured: IMeasured | null;
}
/**
 * What the route said before the launch: seconds to Ready (queue + boot + transfer), dollars for the planned hours.
 */
export interface IPredicted {
  time_to_ready_s?: number;
  boot_s?: number;
  catalog_boot_s?: number;
  transfer_s?: number;
  queue_s?: number;
  bytes?: number;
  hours?: number;
  /**
   * What providers bill for the planned hours (GPU, egress, storage).
   */
  cost?: number;
  /**
   * The route's total, queue and risk included.
   */
  total?: number;
  /**
   * Where boot_s came from: the catalog, this offer's recent measured boots, or the catalog corrected by its provider's.
   */
  boot_basis?: 'catalog' | 'measured' | 'provider';
}
/**
 * What happened, on the orchestrator's clock from the route's launch (up_s: the machine was up; boot_s: launch to Ready less the transfer) and the worker's (transfer_s, environment_s, verify_s); spend, hours and cost (that rate for the planned hours) once the machine was released or lost.
 */
export interface IMeasured {
  time_to_ready_s?: number;
  up_s?: number;
  boot_s?: number;
  transfer_s?: number;
  environment_s?: number;
  verify_s?: number;
  spend?: number;
  hours?: number;
  cost?: number;
}
export interface ILost {
  reason: string | null;
  at: string | null;
  allocation_id?: string | null;
}
export interface ISnapshotInfo {
  version: number;
  created: string;
  files: number;
  bytes: number;
  message: string | null;
}
/**
 * Where the budget stands; only `state` ("unknown") and `message` when it cannot be told.
 */
export interface IBudget {
  spent?: number;
  cap?: number | null;
  left?: number | null;
  state: 'ok' | 'warn' | 'exhausted' | 'unknown';
  message?: string | null;
}
/**
 * The active machine's idle clock, as the last check saw it, or the idle stop that released the last one.
 */
export interface IIdle {
  /**
   * off (idle_minutes is 0), busy (a cell runs), idle, warning (the last warn_s seconds: count down, offer Keep running), stop (being released), released.
   */
  state: 'off' | 'busy' | 'idle' | 'warning' | 'stop' | 'released';
  /**
   * The workspace's idle_minutes.
   */
  minutes: number;
  /**
   * When no cell ran and the GPUs did no work from.
   */
  idle_since: string | null;
  /**
   * When the machine is sealed and released unless it is used.
   */
  stop_at: string | null;
  /**
   * Seconds until stop_at, when the state was answered.
   */
  remaining_s: number | null;
  /**
   * How long before stop_at the sidebar counts down.
   */
  warn_s: number;
  released: IIdleRelease | null;
}
/**
 * An idle stop: which machine, on which route, when, and what it saves from then on.
 */
export interface IIdleRelease {
  allocation_id: string | null;
  /**
   * The route it ran on: Continue may take it again if it is still open.
   */
  route: string | null;
  minutes: number;
  at: string | null;
  idle_since: string | null;
  /**
   * The machine's $/h, no longer billed from the stop on.
   */
  saved_per_hour: number | null;
  /**
   * What happened and what it saves, e.g. Released after 30 min idle; saves about $1.35/h from now on.
   */
  message: string;
}
/**
 * One machine the workspace had (or a launch that was given up).
 */
export interface IMachine {
  allocation_id: string | null;
  provider: string | null;
  offer: string | null;
  gpu: string | null;
  region: string | null;
  price_per_hour: number | null;
  /**
   * active, released, lost, failed (launch), refused (admission), ...
   */
  state: string;
  started: string | null;
  stopped: string | null;
  /**
   * Why it stopped, in the words recorded; null while it runs.
   */
  reason: string | null;
  /**
   * Dollars: as recorded at its stop, or so far while it runs.
   */
  cost: number;
  /**
   * It serves the workspace now.
   */
  current: boolean;
}
/**
 * One spend figure for the workspace: the total, the current machine's part and the rest.
 */
export interface ISpend {
  total: number;
  /**
   * The machine serving the workspace now; null when there is none.
   */
  current: number | null;
  /**
   * Every earlier machine.
   */
  before: number;
  /**
   * "$0.04 so far: $0.03 on this machine, $0.01 before".
   */
  text: string;
}
/**
 * POST /portable/api/stop: sealed, read back and released.
 */
export interface IStopAnswer {
  state: LifecycleState;
  version: number;
  sealed_version?: number;
  allocation_id?: string | null;
  route?: string | null;
  verified?: boolean;
}
