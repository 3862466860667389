/**
 * The shapes of the server extension's REST API and events (docs/api.md), as the sidebar
 * reads them.
 *
 * GENERATED from the JSON Schemas in jupyter_portable/interfaces/serverext/schemas/:
 *   cancel.json
 *   checkpoints.json
 *   continue-request.json
 *   continue.json
 *   empty-request.json
 *   error.json
 *   files.json
 *   orphan-terminate.json
 *   orphans-query.json
 *   orphans-request.json
 *   orphans.json
 *   reservation-check.json
 *   reservation-request.json
 *   reservation.json
 *   reservations-query.json
 *   reservations.json
 *   routes-query.json
 *   routes.json
 *   settings-request.json
 *   settings.json
 *   snapshot-request.json
 *   snapshot.json
 *   state.json
 *   stop.json
 * and the event schemas in jupyter_portable/interfaces/serverext/events/:
 *   changed.yaml
 *   notice.yaml
 *   progress.yaml
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
 * now: charged at booking; before: charged automatically CHARGE_LEAD_HOURS (2 h) before the start.
 */
export type ChargePolicy = 'now' | 'before';
export type Guarantee = 'provider' | 'capacity-checked' | 'best-effort';
/**
 * A checkpoint's state on its way to verified, and how it ended (jupyter_portable/core/state_words.py CHECKPOINT_PHASES, whose words the server sends as `phase`).
 */
export type CheckpointState =
  | 'queued'
  | 'uploading'
  | 'verifying'
  | 'publishing'
  | 'verified'
  | 'rejected'
  | 'skipped'
  | 'failed';
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
 * POST /portable/api/cancel, stop and keep-running: no fields (an empty object, or no body).
 */
export interface IEmptyRequest {}
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
   * bill: the provider's billing records; provider-rate: the provider's own rate x its own start time; estimate: a listed price x time.
   */
  spend_source: 'bill' | 'provider-rate' | 'estimate' | null;
  /**
   * null: not judged here (another store's workspace).
   */
  orphan: boolean | null;
  why: string;
}
/**
 * GET /portable/api/orphans?refresh=1: 1 sweeps the providers again first; 0 or left out, the last sweep.
 */
export interface IOrphansQuery {
  refresh?: 0 | 1;
}
/**
 * POST /portable/api/orphans: terminate one listed orphan, named as provider/ref.
 */
export interface IOrphansRequest {
  terminate: string;
}
/**
 * POST /portable/api/reservations/check (a body as for POST /portable/api/reservations, reservation-request.json): what that booking would answer now, by the same checks (the start and length rules, the capacity left, the budget and the $/h cap), with nothing booked or bought (jupyter_portable/orchestration/reservations.py check_booking).
 */
export interface IBookingCheck {
  /**
   * provider/offer-id, as asked.
   */
  offer: string;
  /**
   * The start, as asked.
   */
  start: string;
  hours: number;
  charge: ChargePolicy;
  /**
   * When the booking, made now, would be charged (core/calendar.py charge_time, on the server's clock); null when the start or the charge policy cannot be read.
   */
  charge_at: string | null;
  /**
   * What the slot would cost in dollars (the provider's quote where it sells the slot); null when the booking is refused before its price is known.
   */
  price: number | null;
  /**
   * Why the booking would be refused, in the words the booking itself would answer; null when it would be booked.
   */
  problem: string | null;
  /**
   * What to do about the problem, where there is a hint.
   */
  hint: string | null;
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
  /**
   * How long the slot lasts, in whole hours (at most 14 days).
   */
  hours: number;
  charge?: ChargePolicy;
  /**
   * The price in dollars the user was shown and confirmed, for a slot the provider sells (an AWS Capacity Block).
   */
  max_price?: number | null;
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
   * What the guarantee holds, in the calendar's words (jupyter_portable/core/calendar.py GUARANTEE_TEXT); sent by the server with every booking it answers.
   */
  guarantee_text: string;
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
 * GET /portable/api/reservations?days=7: how many days of the calendar to show (left out: 7).
 */
export interface IReservationsQuery {
  days?: number;
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
  /**
   * What a booking of this offer would hold, in the words its record will say (jupyter_portable/core/calendar.py GUARANTEE_TEXT): the calendar promises only what the booking records.
   */
  guarantee_text: string;
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
 * GET /portable/api/routes?hours=8: the hours the routes are priced for (left out: the workspace's planned hours).
 */
export interface IRoutesQuery {
  hours?: number;
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
   * The chance of a failed launch or a lost machine within the planned hours, 0..1, what recently happened to the offer included.
   */
  p_fail?: number;
  /**
   * What the risk term is made of; null from an older server.
   */
  risk?: null | IRisk;
  /**
   * The route's place in the order to try them (1: the best open route); blocked routes follow.
   */
  rank?: number;
  /**
   * Why this cheaper open route is not first (its offer was preempted repeatedly in the last hour and another route is within the margin), in words; null otherwise.
   */
  demoted?: string | null;
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
 * A route's risk: the chance of a failed launch and of a lost machine within the planned hours, and what each costs the researcher.
 */
export interface IRisk {
  /**
   * The chance the launch fails, 0..1.
   */
  p_launch: number;
  /**
   * The chance the machine is lost (preempted) within the planned hours, 0..1.
   */
  p_lost: number;
  /**
   * What a failed launch wastes: the boot and the transfer, in seconds.
   */
  launch_s: number;
  /**
   * The time to notice a lost machine, in seconds.
   */
  notice_s: number;
  /**
   * The time to Continue again (this route's time to Ready), in seconds.
   */
  again_s: number;
  /**
   * The work since the last verified checkpoint a loss throws away, on average, in seconds.
   */
  work_s: number;
  /**
   * The hours a failure is expected to cost: the risk term in hours.
   */
  hours: number;
  /**
   * What an hour lost costs on this route, in $/h.
   */
  rate: number;
  /**
   * How old the last verified checkpoint is now, in seconds; null when there is none.
   */
  checkpoint_age_s?: number | null;
  /**
   * The workspace's usual gap between verified checkpoints, in seconds; null with fewer than two.
   */
  checkpoint_every_s?: number | null;
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
  container_image?: string | null;
  machine_image?: string | null;
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
  /**
   * The container image RunPod, Vast.ai and the local market start; null: each provider's default.
   */
  container_image: string | null;
  /**
   * The image AWS (an AMI) or Google Cloud (an image or family) boots, the one cloud of its form; null: each cloud's default.
   */
  machine_image: string | null;
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
 * POST /portable/api/snapshot: the version published; changed is false when nothing had changed; skipped names every file not backed up (changed while read, a symlink leading outside the workspace, a name the store cannot hold).
 */
export interface ISnapshotAnswer {
  version: number;
  changed: boolean;
  /**
   * Paths not backed up by this snapshot (absent from workers older than this field).
   */
  skipped?: string[];
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
   * The machine no path (heartbeat, SSH) reaches now, since when, and what was last heard (jupyter_portable/core/reachability.py); null while it answers. Nothing is released meanwhile: it is LOST only on the provider's word, or after c.Portable.unreachable_grace seconds while the provider cannot say it runs.
   */
  unreachable?: IUnreachable | null;
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
  /**
   * Checkpoints on their way to verified (uploading, reading back, sealing), on this computer or on the machine serving the workspace (its worker reports them), oldest first; then those that ended in the last ten minutes, newest first: verified (latest or not) or why not. The words are core/state_words.py's, as `%workspace checkpoints` and `jupyter portable status` say them.
   */
  checkpoints_in_flight?: ICheckpointInFlight[];
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
  /**
   * Every lifecycle state's words (jupyter_portable/core/state_words.py), one table: the toolbar, the badges, a cell's error and `jupyter portable status` say a state in these words.
   */
  states?: {
    IDLE: IStateWords;
    ACTIVE: IStateWords;
    DRAINING: IStateWords;
    SEALED: IStateWords;
    RELEASED: IStateWords;
    LOST: IStateWords;
    ROUTING: IStateWords;
    ACQUIRING: IStateWords;
    PROBING: IStateWords;
    MATERIALIZING: IStateWords;
    VERIFYING: IStateWords;
    READY: IStateWords;
    FAILED: IStateWords;
  };
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
  /**
   * The state in words, as `jupyter portable state` says it (core/state_words.py): "LOST at version 4: the machine went away ...".
   */
  line?: string;
  /**
   * The version the workspace is safe at: the newest published (a machine may have published past version); null before the first.
   */
  safe_version?: number | null;
  /**
   * The words of a move in progress: "Starting the first machine" until a machine has served the workspace, then "Continuing".
   */
  move?: string;
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
   * When the machine ends by itself (a Slurm job's walltime), ISO UTC: the sidebar counts down to it. Absent for a machine that does not.
   */
  ends_at?: string;
  /**
   * The provider's id of the machine queued ahead to take over when this one ends (c.PortableSlurm.queue_next); null when none is.
   */
  next_job?: string | null;
  /**
   * What the route predicted for this machine and, once it was Ready, what was measured (the allocation record's predicted and measured); null for a machine from before estimates were recorded.
   */
  estimate?: IEstimate | null;
  /**
   * The notebook's environment on this machine once it was Ready: the Python and each difference from the recorded lockfile (issue 26); null before Ready or for a machine from before it was recorded.
   */
  environment?: IEnvironment | null;
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
export interface IEnvironment {
  /**
   * image: the machine's own Python; lockfile: the recorded environment built for it.
   */
  mode: 'image' | 'lockfile';
  /**
   * Your Python and the machine's, when their versions differ.
   */
  python: IPythonChange | null;
  /**
   * Every recorded version, on the same Python.
   */
  exact: boolean;
  changes: IEnvChange[];
  /**
   * One line for a person, e.g. 'Python 3.11.7 -> 3.10.13; 1 difference from the recorded environment: ipython 9.18.1 -> 8.39.0 (requires-python)'.
   */
  summary: string;
}
export interface IPythonChange {
  recorded: string;
  installed: string;
}
export interface IEnvChange {
  name: string;
  recorded: string | null;
  installed: string | null;
  /**
   * requires-python, no-wheel, yanked, not-found, dependency, image, platform-only, added or built.
   */
  why: string;
  kind: 'changed' | 'kept' | 'left-out' | 'added' | 'built';
  detail: string;
}
export interface ILost {
  reason: string | null;
  at: string | null;
  allocation_id?: string | null;
}
export interface IUnreachable {
  allocation_id: string;
  since: string;
  /**
   * The words every view uses: "unreachable since 14:02Z" (UTC).
   */
  line: string;
  reason?: string | null;
}
export interface ISnapshotInfo {
  version: number;
  created: string;
  files: number;
  bytes: number;
  message: string | null;
}
/**
 * One checkpoint in flight, or one that ended lately (the record of jupyter_portable/engine/checkpoint/background.py, as the state shows it).
 */
export interface ICheckpointInFlight {
  /**
   * The record's key: the process and the moment it was registered.
   */
  key: string;
  path: string;
  step: number | null;
  state: CheckpointState;
  /**
   * The state in the user's words: uploading, reading back, sealing, verified, ...
   */
  phase: string;
  /**
   * Bytes done of the phase's total, 0-100, while uploading or reading back; null otherwise.
   */
  percent: number | null;
  done_bytes: number;
  total_bytes: number;
  /**
   * The checkpoint's bytes on local disk.
   */
  size: number;
  /**
   * Bytes a second in the phase: its bytes done over the time it has run (a stalled upload's falls).
   */
  rate: number;
  /**
   * Why it was not verified (rejected, skipped, failed).
   */
  reason: string | null;
  /**
   * When it ended (UTC, ISO); null while in flight.
   */
  ended: string | null;
  /**
   * When its phase began (UTC, ISO, on the clock of the machine that runs it): `rate` is `done_bytes` over the time since, to the state's answer.
   */
  since: string | null;
  /**
   * The version that published it, once it ended verified or rejected.
   */
  version: number | null;
  /**
   * It ended verified and is the workspace's latest verified checkpoint.
   */
  latest: boolean;
  /**
   * The allocation whose kernel registered it; null: this computer.
   */
  machine: string | null;
  /**
   * The whole line: 'step 1200: uploading 63%, 1.1 GB/s', 'step 1200: verified, latest (version 7)'.
   */
  line: string;
}
/**
 * Where the budget stands; only `state` ("unknown") and `message` when it cannot be told.
 */
export interface IBudget {
  spent?: number;
  /**
   * What bookings hold back and no machine has spent yet: a provider-sold booking's price less what machines launched into it recorded; any other booking's price until its slot starts.
   */
  committed?: number;
  cap?: number | null;
  /**
   * cap - spent - committed (never below 0); null without a budget. The figure every view shows.
   */
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
   * Where cost comes from: bill (the provider's billing records), provider-rate (the provider's own rate x its own start time) or estimate (a listed price x time).
   */
  cost_source?: 'bill' | 'provider-rate' | 'estimate';
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
 * What one lifecycle state means to the user.
 */
export interface IStateWords {
  /**
   * The toolbar's words, e.g. 'No machine (RELEASED)'.
   */
  label: string;
  /**
   * One line: what is true in this state.
   */
  meaning: string;
  /**
   * A machine is held, and billed, in this state.
   */
  machine: boolean;
  /**
   * What the user can do now.
   */
  action: string;
  /**
   * A cell run asks 'Start a machine?' before renting one, as for the first machine.
   */
  ask: boolean;
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
/**
 * The workspace's settings or its bookings changed in its store, from this server (the sidebar, the Settings Editor) or from anywhere else (`jupyter portable settings` or `reserve` in a terminal, another server): the sidebar reads them again, with the budget's figures. Seen by the server's check within seconds. `idle`: a change of the idle stop's minutes started the countdown again. `budget`: the running machine's spend moved by a cent: the budget's figures (spent, left, the routes' refusals) are read again. `checkpoints`: a checkpoint in flight (on this computer or on the machine) moved on or ended: the state's `checkpoints_in_flight` changed.
 *
 */
export interface IChangedEvent {
  workspace_id: string;
  what: 'settings' | 'reservations' | 'idle' | 'budget' | 'checkpoints';
  [k: string]: unknown;
}
/**
 * What to tell the user once: lost, ready, failed, unreachable (no path reaches the machine: "unreachable since 14:02Z", nothing is released), reachable (it answers again, nothing was lost), conflict, budget, idle (a countdown began, or an idle machine was released), moved (the notebook's kernels now run on the new machine: "Now on GPU (provider, region). Workspace version N verified."), refused (files from the machine the inbound gate did not write into the user's copy, each with its reason: docs/security.md), offered (a file new on the machine that differs from the user's own: the user's stays, the machine's is kept there), walltime (a machine that ends by itself, a Slurm job's walltime: the user asked in time, the next job queued ahead, or the workspace going on by itself on it).
 *
 */
export interface INoticeEvent {
  workspace_id: string;
  kind:
    | 'lost'
    | 'ready'
    | 'failed'
    | 'conflict'
    | 'budget'
    | 'idle'
    | 'moved'
    | 'refused'
    | 'offered'
    | 'unreachable'
    | 'reachable'
    | 'walltime';
  message: string;
  [k: string]: unknown;
}
/**
 * Progress inside one step of a Continue, a snapshot or a seal: acquire, probe,
 * materialize, verify, reconnect, snapshot, seal, or of following the machine's files (follow).
 *
 */
export interface IProgressEvent {
  workspace_id: string;
  step:
    'acquire' | 'probe' | 'materialize' | 'verify' | 'reconnect' | 'snapshot' | 'seal' | 'follow';
  message: string;
  done?: number | null;
  total?: number | null;
  [k: string]: unknown;
}

// Values, GENERATED from the same schemas.
/** The $id of jupyter_portable/interfaces/serverext/events/changed.yaml. */
export const CHANGED_SCHEMA = 'https://events.jupyter-portable.org/changed/v1';
/** The $id of jupyter_portable/interfaces/serverext/events/notice.yaml. */
export const NOTICE_SCHEMA = 'https://events.jupyter-portable.org/notice/v1';
/** The $id of jupyter_portable/interfaces/serverext/events/progress.yaml. */
export const PROGRESS_SCHEMA = 'https://events.jupyter-portable.org/progress/v1';
/** The $id of jupyter_portable/interfaces/serverext/events/state.yaml. */
export const STATE_SCHEMA = 'https://events.jupyter-portable.org/state/v1';
/** How many hours before its start a booking charged "before" is charged (jupyter_portable/core/calendar.py CHARGE_LEAD). */
export const CHARGE_LEAD_HOURS = 2;
/** The four separate checks of an offer, in the order they are made and shown (jupyter_portable/core/offers.py Checks). */
export const CHECK_NAMES = ['listed', 'permitted', 'capacity', 'launched'] as const;
/** Each provider by the name its users know it by (jupyter_portable/compute/registry.py PROVIDER_NAME). */
export const PROVIDER_NAME = { 'local': 'Local market', 'ssh': 'SSH host', 'runpod': 'RunPod', 'vastai': 'Vast.ai', 'lambda': 'Lambda', 'aws': 'AWS', 'gcp': 'Google Cloud', 'slurm': 'Slurm' } as const;
/** What kind of thing each reason key of a blocked route is: a cap, a requirement the offer does not meet, or the offer not available now (jupyter_portable/core/routing.py REASON_CATEGORY). */
export const REASON_CATEGORY = { 'price_cap': 'cap', 'price': 'cap', 'budget': 'cap', 'gpu': 'admission', 'gpu_count': 'admission', 'gpu_memory': 'admission', 'driver': 'admission', 'cuda': 'admission', 'image': 'admission', 'region': 'admission', 'listed': 'capacity', 'permitted': 'capacity', 'capacity': 'capacity', 'launched': 'capacity' } as const;
/** The idle stop of a workspace that sets none, in minutes (jupyter_portable/core/idle.py DEFAULT_IDLE_MINUTES). */
export const DEFAULT_IDLE_MINUTES = 30;
/** The control message the placeholder kernel answers: {asker}, or {answer, reason} (jupyter_portable/interfaces/kernel/placeholder.py FIRST_MACHINE_MSG). */
export const FIRST_MACHINE_MSG = 'portable_first_machine_request';
/** The MIME type the %workspace resume magic displays to ask the notebook to tag its cell (jupyter_portable/interfaces/kernel/resume.py TAG_MIME). */
export const TAG_MIME = 'application/vnd.jupyter-portable.resume-tag+json';
/** The cell tag that marks a notebook's resume cell (jupyter_portable/interfaces/kernel/resume.py RESUME_TAG). */
export const RESUME_TAG = 'portable-resume';
/** The step of a Continue that runs in each of its states (jupyter_portable/core/lifecycle.py STATE_STEP). */
export const STATE_STEP = { 'ACQUIRING': 'acquire', 'PROBING': 'probe', 'MATERIALIZING': 'materialize', 'VERIFYING': 'verify', 'READY': 'reconnect' } as const;
/** The steps of a Continue as the sidebar shows them, in order (jupyter_portable/core/lifecycle.py CONTINUE_STEPS). */
export const CONTINUE_STEPS = ['acquire', 'probe', 'materialize', 'verify', 'reconnect'] as const;
/** The states a Continue may begin from (jupyter_portable/core/lifecycle.py CONTINUE_FROM). */
export const CONTINUE_FROM = ['IDLE', 'LOST', 'RELEASED', 'FAILED'] as const;
/** The states of a Continue in flight, in order (jupyter_portable/core/lifecycle.py CONTINUE_STATES). */
export const CONTINUE_STATES = ['ROUTING', 'ACQUIRING', 'PROBING', 'MATERIALIZING', 'VERIFYING', 'READY'] as const;
