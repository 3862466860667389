/**
 * What the sidebar knows, kept live by the server's events: on each event of ours the
 * state is fetched again (one fetch at a time; events during a fetch cause one more), and
 * Continue's progress is reduced from the events themselves. Nothing polls the server.
 */

import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { snapshotLine } from './format';
import { PortableApiError, PortableClient } from './api';
import { keepSelection } from './routes';
import {
  applyProgressEvent,
  applyStateEvent,
  idleProgress,
  IContinueProgress,
  progressFromLifecycle
} from './progress';
import {
  CHANGED_SCHEMA,
  IChangedEvent,
  INoticeEvent,
  IProgressEvent,
  IStateEvent,
  NOTICE_SCHEMA,
  PROGRESS_SCHEMA,
  STATE_SCHEMA
} from './events';
import { DEFAULT_SETTINGS, IPortableSettings } from './settings';

/** While a machine runs, the routes are read again at most this often unless the budget's left decides one. */
const ROUTES_TICK_MS = 60000;

/** Whether what is left of the budget blocks a route now (its refusal quotes the figure, which ticks). */
export function budgetDecidesRoutes(routes: { routes: Array<{ blocked?: string | null }> } | null): boolean {
  return !!routes?.routes.some(r => (r.blocked ?? '').includes('left of the budget'));
}
import { IBookingCheck, IBookingRequest, IPortableState, IReservationsAnswer, IRoutesAnswer } from './types';
import {
  changedKeys,
  fromWorkspace,
  IWorkspaceFields,
  toBody,
  workspaceFields,
  WorkspaceKey
} from './workspaceSettings';

/** How the model tells the user something once (JupyterLab's notifications in the app). */
export interface INotifier {
  notice(kind: INoticeEvent['kind'], message: string): void;
  error(message: string): void;
}

/** The event stream's part the model needs: ``app.serviceManager.events.stream``. */
export interface IEmissionSource {
  connect(
    slot: (sender: unknown, emission: { schema_id: string; [key: string]: unknown }) => void,
    thisArg?: unknown
  ): boolean;
  disconnect(
    slot: (sender: unknown, emission: { schema_id: string; [key: string]: unknown }) => void,
    thisArg?: unknown
  ): boolean;
}

/**
 * Writes the workspace's fields into the user's settings (JupyterLab's registry), so the
 * Settings Editor shows the values in effect; one write for all of them.
 */
export type RegistryMirror = (fields: IWorkspaceFields) => Promise<void>;

export type Action =
  | 'snapshot'
  | 'continue'
  | 'cancel'
  | 'stop'
  | 'book'
  | 'cancel-booking'
  | 'routes'
  | 'reservations'
  | 'settings';

export interface IStatus {
  kind: 'info' | 'error';
  text: string;
  /** The lifecycle (state@version) a line speaks of: it goes once the workspace moves on. */
  lifecycle?: string;
}

/** "RELEASED@9": the lifecycle a status line speaks of. */
export function lifecycleKey(state: string, version: number): string {
  return `${state}@${version}`;
}

export class PortableModel implements IDisposable {
  constructor(
    private readonly client: PortableClient,
    private readonly events: IEmissionSource | null,
    private readonly notifier: INotifier,
    private readonly mirror: RegistryMirror | null = null
  ) {
    this.events?.connect(this._onEmission, this);
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  state: IPortableState | null = null;
  /** When ``state`` was fetched (ms), to advance uptime between fetches. */
  fetchedAt = 0;
  stateError: PortableApiError | null = null;
  routes: IRoutesAnswer | null = null;
  private _routesAt = 0; // when the routes were last read (Date.now())
  routesError: PortableApiError | null = null;
  hours: number = DEFAULT_SETTINGS.plannedHours;
  selectedRoute: string | null = null;
  progress: IContinueProgress = idleProgress();
  /** The last progress/v1 event of a snapshot or seal. */
  otherProgress: IProgressEvent | null = null;
  reservations: IReservationsAnswer | null = null;
  reservationsError: PortableApiError | null = null;
  reservationDays = 7;
  settings: IPortableSettings = { ...DEFAULT_SETTINGS };
  /** How many changes of the workspace's settings this sidebar was told of. */
  settingsSeen = 0;
  /** The outcome of the user's last action, shown under the section it came from. */
  status: { [K in Action]?: IStatus } = {};
  readonly busy = new Set<Action>();

  /** Fetch everything once; from then on, events drive the fetches. */
  async start(): Promise<void> {
    await this.refreshState();
    await Promise.all([this.refreshRoutes(), this.refreshReservations()]);
  }

  /**
   * The user's settings, from the registry on load and on each change. On load the workspace's
   * values (kept in its store) are shown and written into the registry, so the Settings Editor
   * shows them; from then on a field the user changes there goes to the server, and the sidebar
   * shows what the workspace answers. Calls run one at a time, in order.
   */
  applySettings(registry: IPortableSettings): Promise<void> {
    const run = this._settingsQueue.then(() => this._applySettings(registry));
    // A failure is the caller's to report; the next change still runs.
    this._settingsQueue = run.catch(() => undefined);
    return run;
  }

  private async _applySettings(registry: IPortableSettings): Promise<void> {
    const previous = this._registry;
    this._registry = registry;
    let send: WorkspaceKey[];
    if (previous === null) {
      try {
        await this._adopt(fromWorkspace(await this.client.workspaceSettings()));
        return;
      } catch (error) {
        // Without the workspace's settings, nothing is sent: show the user's and say why.
        this.status.settings = {
          kind: 'error',
          text: `Cannot read the workspace's settings: ${asApiError(error).full}`
        };
        this._showSettings(registry);
        return;
      }
    } else {
      send = changedKeys(workspaceFields(previous), workspaceFields(registry));
      this._showSettings({ ...this.settings, storeUrl: registry.storeUrl });
    }
    if (send.length === 0) {
      return;
    }
    let applied = false;
    await this._run('settings', async () => {
      try {
        const answer = await this.client.putWorkspaceSettings(toBody(workspaceFields(registry), send));
        this.status.settings = { kind: 'info', text: 'Settings applied to the workspace' };
        this._showSettings({ ...registry, ...fromWorkspace(answer) });
        applied = true;
      } catch (error) {
        const text = `Workspace settings not applied: ${asApiError(error).full}`;
        this.status.settings = { kind: 'error', text };
        this.notifier.error(text);
      }
    });
    if (applied) {
      // The routes depend on the driver, the cap and the hours; the budget is in the state.
      await Promise.all([this.refreshState(), this.refreshRoutes()]);
    }
  }

  /**
   * The workspace's settings changed in its store (a terminal's `jupyter portable settings`, another
   * server, or this sidebar's own change coming back): show them and mirror them into the registry.
   */
  workspaceSettingsChanged(): Promise<void> {
    const run = this._settingsQueue.then(async () => {
      try {
        await this._adopt(fromWorkspace(await this.client.workspaceSettings()));
      } catch (error) {
        this.status.settings = {
          kind: 'error',
          text: `Cannot read the workspace's settings: ${asApiError(error).full}`
        };
        this._emit();
      }
    });
    this._settingsQueue = run.catch(() => undefined);
    return run
      .then(() => Promise.all([this.refreshState(), this.refreshRoutes()]))
      .then(() => {
        // what the server answered before this change (a booking's dry run) is asked again, even
        // when the state reads the same: a budget set and cleared at once leaves it unchanged
        this.settingsSeen += 1;
        this._emit();
      });
  }

  /** Show the workspace's ``current`` fields, and write them into the registry where it differs. */
  private async _adopt(current: IWorkspaceFields): Promise<void> {
    const base = this._registry ?? { ...DEFAULT_SETTINGS };
    const differs = changedKeys(workspaceFields(base), current).length > 0;
    // The registry's coming change is this one: set first, so nothing is sent back to the server.
    this._registry = { ...base, ...current };
    this._showSettings({ ...this.settings, ...current, storeUrl: base.storeUrl });
    if (differs && this.mirror) {
      try {
        await this.mirror(current);
      } catch (error) {
        console.warn('jupyter-portable: the Settings Editor could not be updated', error);
      }
    }
  }

  private _showSettings(settings: IPortableSettings): void {
    const hoursChanged = settings.plannedHours !== this.settings.plannedHours;
    this.settings = settings;
    if (hoursChanged) {
      this.hours = settings.plannedHours;
      if (this.state && !this.busy.has('settings')) {
        void this.refreshRoutes();
      }
    }
    this._emit();
  }

  /** Whether a Continue may start now. */
  get canContinue(): boolean {
    const s = this.state;
    // the server decides (can_continue); the browser adds only its own busy flag
    return !!s && s.can_continue && !this.busy.has('continue');
  }

  /** Fetch the state; concurrent calls share one fetch plus at most one more. */
  refreshState(): Promise<void> {
    if (this._stateFetch) {
      this._stateAgain = true;
      return this._stateFetch;
    }
    this._stateFetch = (async () => {
      try {
        do {
          this._stateAgain = false;
          try {
            const state = await this.client.state();
            const history = machinesKey(state);
            if (this.state && history !== machinesKey(this.state)) {
              // A machine's fate was recorded (a loss may be recorded after the LOST event):
              // what happened to its offer changes that route's risk.
              void this.refreshRoutes();
            }
            this.state = state;
            this._dropStale(lifecycleKey(state.lifecycle.state, state.lifecycle.version));
            this.fetchedAt = Date.now();
            this.stateError = null;
            this.progress = progressFromLifecycle(state.lifecycle, this.progress);
          } catch (error) {
            this.stateError = asApiError(error);
          }
          this._emit();
        } while (this._stateAgain && !this._disposed);
      } finally {
        this._stateFetch = null;
      }
    })();
    return this._stateFetch;
  }

  async refreshRoutes(hours: number = this.hours): Promise<void> {
    this.hours = hours;
    await this._run('routes', async () => {
      try {
        const answer = await this.client.routes(hours);
        this.routes = answer;
        this._routesAt = Date.now();
        this.routesError = null;
        this.selectedRoute = keepSelection(this.selectedRoute, answer);
      } catch (error) {
        this.routesError = asApiError(error);
      }
    });
  }

  async refreshReservations(days: number = this.reservationDays): Promise<void> {
    this.reservationDays = days;
    await this._run('reservations', async () => {
      try {
        this.reservations = await this.client.reservations(days);
        this.reservationsError = null;
      } catch (error) {
        this.reservationsError = asApiError(error);
      }
    });
  }

  selectRoute(id: string | null): void {
    this.selectedRoute = id;
    this._emit();
  }

  async continueWork(): Promise<void> {
    await this._act('continue', async () => {
      await this.client.continue(this.selectedRoute);
      return 'Continue started';
    });
    await this.refreshState();
  }

  async cancelContinue(): Promise<void> {
    await this._act('cancel', async () => {
      const { cancelled } = await this.client.cancel();
      return cancelled
        ? 'Cancel requested: Continue stops at its next step'
        : 'Nothing to cancel';
    });
  }

  /** Seal (publish and read back the final version), then release the machine. */
  async stop(): Promise<void> {
    let at = '';
    await this._act('stop', async () => {
      const { state, version } = await this.client.stop();
      at = lifecycleKey(state, version);
      const words = this.state?.states?.[state];
      return `${state} at version ${version}` + (words ? `: ${words.meaning}` : '');
    });
    if (at && this.status.stop) {
      // "RELEASED at version 9" never stays next to a newer state or version
      this.status.stop.lifecycle = at;
    }
    await Promise.all([this.refreshState(), this.refreshRoutes()]);
  }

  async snapshot(message: string): Promise<void> {
    await this._act('snapshot', async () => {
      const { version, changed, skipped } = await this.client.snapshot(message);
      return snapshotLine(version, changed, skipped?.length ?? 0);
    });
    await this.refreshState();
  }

  async book(request: IBookingRequest): Promise<boolean> {
    delete this.status['cancel-booking']; // the lines say what happened last, not before
    const ok = await this._act('book', async () => {
      const b = await this.client.book(request);
      return `Booked ${b.offer_key} (${b.reservation_id})`;
    });
    // a booking holds money back: the budget and the routes' "left" change with it
    await Promise.all([this.refreshReservations(), this.refreshState(), this.refreshRoutes()]);
    return ok;
  }

  /**
   * The server's answer for a booking not yet made: its problem, charge time and price by
   * the booking's own rules and clock. Nothing is booked; a failure is the caller's to show.
   * One function for the model's life, so a panel can ask again only when its selection changes.
   */
  readonly checkBooking = (request: IBookingRequest): Promise<IBookingCheck> => this.client.checkBooking(request);

  async cancelBooking(id: string): Promise<void> {
    delete this.status.book; // "Booked ..." no longer holds
    await this._act('cancel-booking', async () => {
      const b = await this.client.cancelBooking(id);
      return b.refund
        ? `Cancelled ${id}; $${b.refund.toFixed(2)} refunded`
        : `Cancelled ${id}`;
    });
    await Promise.all([this.refreshReservations(), this.refreshState(), this.refreshRoutes()]);
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.events?.disconnect(this._onEmission, this);
    Signal.clearData(this);
  }

  private _onEmission(
    _sender: unknown,
    emission: { schema_id: string; [key: string]: unknown }
  ): void {
    const id = emission.schema_id;
    if (id !== STATE_SCHEMA && id !== PROGRESS_SCHEMA && id !== NOTICE_SCHEMA && id !== CHANGED_SCHEMA) {
      return;
    }
    const workspace = emission['workspace_id'];
    if (this.state && workspace && workspace !== this.state.workspace.id) {
      return;
    }
    if (id === STATE_SCHEMA) {
      const ev = emission as unknown as IStateEvent;
      this.progress = applyStateEvent(this.progress, ev);
      if (ev.state === 'ACTIVE' || ev.state === 'FAILED' || ev.state === 'ROUTING') {
        // the progress now tells how the Continue went; "Continue started" is stale
        delete this.status.continue;
        delete this.status.cancel;
      }
      this._emit();
      void this.refreshState();
      if (ev.state === 'LOST' || ev.state === 'FAILED' || ev.state === 'RELEASED') {
        // Where the work can go next has changed: price the routes again.
        void this.refreshRoutes();
      }
    } else if (id === CHANGED_SCHEMA) {
      const ev = emission as unknown as IChangedEvent;
      if (ev.what === 'settings') {
        void this.workspaceSettingsChanged();
      } else if (ev.what === 'reservations') {
        // what bookings hold back is in the budget, the state and the routes' "left"
        void Promise.all([this.refreshReservations(), this.refreshState(), this.refreshRoutes()]);
      } else if (ev.what === 'budget') {
        // the running machine's spend moved a cent: the spend line ticks with it, and so do the routes
        // where what is left decides them (each route read asks every provider for its offers: not
        // at every cent otherwise)
        void this.refreshState();
        if (budgetDecidesRoutes(this.routes) || Date.now() - this._routesAt > ROUTES_TICK_MS) {
          void this.refreshRoutes();
        }
      } else {
        void this.refreshState();
      }
    } else if (id === PROGRESS_SCHEMA) {
      const ev = emission as unknown as IProgressEvent;
      if (ev.step === 'snapshot' || ev.step === 'seal') {
        this.otherProgress = ev;
      } else {
        this.progress = applyProgressEvent(this.progress, ev);
      }
      this._emit();
    } else {
      const ev = emission as unknown as INoticeEvent;
      this.notifier.notice(ev.kind, ev.message);
      void this.refreshState();
    }
  }

  private async _run(action: Action, work: () => Promise<void>): Promise<void> {
    this.busy.add(action);
    this._emit();
    try {
      await work();
    } finally {
      this.busy.delete(action);
      this._emit();
    }
  }

  /** Drop the status lines that speak of a lifecycle other than ``now`` (state@version). */
  private _dropStale(now: string): void {
    for (const key of Object.keys(this.status) as Action[]) {
      const line = this.status[key];
      if (line?.lifecycle && line.lifecycle !== now) {
        delete this.status[key];
      }
    }
  }

  /** Run a user action: its outcome or its error goes to ``status[action]``. */
  private async _act(action: Action, work: () => Promise<string>): Promise<boolean> {
    let ok = false;
    await this._run(action, async () => {
      try {
        this.status[action] = { kind: 'info', text: await work() };
        ok = true;
      } catch (error) {
        const e = asApiError(error);
        this.status[action] = { kind: 'error', text: e.full };
        this.notifier.error(e.full);
      }
    });
    return ok;
  }

  private _emit(): void {
    if (!this._disposed) {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _disposed = false;
  private _stateFetch: Promise<void> | null = null;
  private _stateAgain = false;
  /** The registry's settings as last applied; null before the first. */
  private _registry: IPortableSettings | null = null;
  private _settingsQueue: Promise<void> = Promise.resolve();
}

/** What the machines history says, in one string, to see that it changed. */
function machinesKey(state: IPortableState): string {
  return (state.machines ?? []).map(m => `${m.allocation_id}:${m.state}`).join(',');
}

function asApiError(error: unknown): PortableApiError {
  if (error instanceof PortableApiError) {
    return error;
  }
  return new PortableApiError(String((error as Error)?.message ?? error), null);
}
