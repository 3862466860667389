/**
 * What the sidebar knows, kept live by the server's events: on each event of ours the
 * state is fetched again (one fetch at a time; events during a fetch cause one more), and
 * Continue's progress is reduced from the events themselves. Nothing polls the server.
 */

import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

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
  INoticeEvent,
  IProgressEvent,
  IStateEvent,
  NOTICE_SCHEMA,
  PROGRESS_SCHEMA,
  STATE_SCHEMA
} from './events';
import { DEFAULT_SETTINGS, IPortableSettings } from './settings';
import { IBookingRequest, IPortableState, IReservationsAnswer, IRoutesAnswer } from './types';
import {
  changedKeys,
  fromWorkspace,
  keysToSendOnLoad,
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
}

export class PortableModel implements IDisposable {
  constructor(
    private readonly client: PortableClient,
    private readonly events: IEmissionSource | null,
    private readonly notifier: INotifier
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
  /** The outcome of the user's last action, shown under the section it came from. */
  status: { [K in Action]?: IStatus } = {};
  readonly busy = new Set<Action>();

  /** Fetch everything once; from then on, events drive the fetches. */
  async start(): Promise<void> {
    await this.refreshState();
    await Promise.all([this.refreshRoutes(), this.refreshReservations()]);
  }

  /**
   * The user's settings, from the registry on load and on each change. The workspace's
   * fields among them go to the server (which ones and when: workspaceSettings.ts), and
   * the sidebar shows what the workspace answers. Calls run one at a time, in order.
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
        const current = fromWorkspace(await this.client.workspaceSettings());
        send = keysToSendOnLoad(workspaceFields(registry), current);
        this._showSettings({ ...registry, ...current });
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
    await this._act('stop', async () => {
      const { state, version } = await this.client.stop();
      return `${state} at version ${version}`;
    });
    await Promise.all([this.refreshState(), this.refreshRoutes()]);
  }

  async snapshot(message: string): Promise<void> {
    await this._act('snapshot', async () => {
      const { version, changed } = await this.client.snapshot(message);
      return changed
        ? `Snapshot version ${version} published`
        : `Nothing changed since version ${version}`;
    });
    await this.refreshState();
  }

  async book(request: IBookingRequest): Promise<boolean> {
    delete this.status['cancel-booking']; // the lines say what happened last, not before
    const ok = await this._act('book', async () => {
      const b = await this.client.book(request);
      return `Booked ${b.offer_key} (${b.reservation_id})`;
    });
    await this.refreshReservations();
    return ok;
  }

  async cancelBooking(id: string): Promise<void> {
    delete this.status.book; // "Booked ..." no longer holds
    await this._act('cancel-booking', async () => {
      const b = await this.client.cancelBooking(id);
      return b.refund
        ? `Cancelled ${id}; $${b.refund.toFixed(2)} refunded`
        : `Cancelled ${id}`;
    });
    await this.refreshReservations();
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
    if (id !== STATE_SCHEMA && id !== PROGRESS_SCHEMA && id !== NOTICE_SCHEMA) {
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
