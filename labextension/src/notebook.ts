/**
 * The notebook side of a Continue (issue 16; docs/continue-experience.md):
 *
 * - each notebook on the portable kernel shows, in its toolbar, when the workspace has no
 *   machine ("No machine (LOST)") or is moving to one;
 * - cells run while a Continue is under way are held and run again, in order, once the
 *   kernel has moved;
 * - after a move: a non-blocking notice ("Now on NVIDIA A100 80GB (runpod, eu-ro-1).
 *   Workspace version 12 verified."), then the cells tagged `portable-resume`, in notebook
 *   order, before the user's next cell; the first that fails stops them;
 * - with no machine yet, the first executed cell asks (Start / Cancel) before renting one: the
 *   placeholder kernel holds the cell while the question is open, and Cancel (or a start that
 *   fails) ends it with an output saying nothing was rented;
 * - `%workspace resume-tag` output turns into the tag on its cell.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, Notebook, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Event, Kernel, KernelMessage } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { PortableApiError, PortableClient } from './api';
import { firstMachineQuestion } from './format';
import { NOTICE_SCHEMA, PROGRESS_SCHEMA, STATE_SCHEMA } from './events';
import { askImplementation } from './kernelInfo';
import {
  findKernelStatusModel,
  IKernelStatusBarModel,
  machineStatus,
  MOVING,
  NO_MACHINE,
  resumedText,
  StateWordsTable,
  statusBarText
} from './kernelStatus';
import {
  FIRST_MACHINE_MSG,
  LifecycleState,
  RESUME_TAG,
  TAG_MIME
} from './types';

// the kernel's protocol names (generated from state.json: interfaces/kernel's)
export { RESUME_TAG, TAG_MIME };
export { machineStatus, resumedText, statusBarText };
export type { StateWordsTable };

const PLACEHOLDER = 'portable-placeholder';
/** How long after a move the notebook waits for its kernel to answer from the new machine. */
const RECONNECT_TIMEOUT_MS = 120000;

export interface INotebookOptions {
  /** Ask before the first machine is rented (the notebook setting confirmFirstMachine). */
  confirmFirstMachine: () => boolean;
}

interface IHeld {
  panel: NotebookPanel;
  cellId: string;
}

/** A route as the placeholder kernel names it (placeholder.py ROUTE_KEYS). */
interface IRouteFacts {
  id: string;
  gpu: string;
  gpu_count: number;
  provider: string;
  offer: string;
  region: string | null;
  price_per_hour: number;
}

/** What the placeholder is told as a question is being asked: it holds the cell for the answer
 * (without it, placeholder.py ASK_WAIT_S later, the cell ends saying nobody asked). */
export const ASKING = { asking: true };

export class PortableNotebooks {
  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly tracker: INotebookTracker,
    private readonly client: PortableClient,
    private readonly options: INotebookOptions
  ) {
    tracker.widgetAdded.connect((_, panel) => this._addStatus(panel));
    tracker.forEach(panel => this._addStatus(panel));
    app.serviceManager.events.stream.connect(this._onEvent, this);
    NotebookActions.executionScheduled.connect((_, args) => this._onScheduled(args.notebook, args.cell.model.id));
    NotebookActions.executed.connect((_, args) => this._applyResumeTag(args.cell));
    Notification.manager.changed.connect((_, change) => {
      if (change.type === 'removed' && change.notification.id === this._question) {
        // the question was dismissed unanswered (the notification center's Dismiss): nothing is rented
        this._question = null;
        this._endHeld('cancel', '', this._questionRoute);
      }
    });
    void this.refresh();
  }

  state: string | null = null;
  /** The server's words for each state (the toolbar's label, and which states ask before renting). */
  words: StateWordsTable | null = null;
  workspaceId: string | null = null;
  private _held: IHeld[] = [];
  /** The routes are being read for a question: a cell run now gets the same answer. */
  private _asking = false;
  /** The open question's notification id (Start / Cancel not pressed yet). */
  private _question: string | null = null;
  /** The route the open question names: its answer carries it, so the cell's output names that one. */
  private _questionRoute: IRouteFacts | null = null;
  private _statusBar: IKernelStatusBarModel | null = null;
  private _moving = false;
  private _notice = '';
  private _status = new Map<NotebookPanel, Widget>();

  async refresh(): Promise<void> {
    try {
      const s = await this.client.state();
      this.state = s.lifecycle.state;
      this.words = s.states ?? null;
      this.workspaceId = s.workspace.id;
    } catch (reason) {
      console.warn('jupyter-portable: no workspace state', reason);
    }
    this._render();
  }

  private _portable(panel: NotebookPanel): boolean {
    const kernel = panel.sessionContext.session?.kernel;
    const name = kernel?.name ?? panel.sessionContext.kernelPreference.name;
    return name === 'portable';
  }

  private _addStatus(panel: NotebookPanel): void {
    const item = new Widget();
    item.addClass('jp-Portable-kernelStatus');
    item.node.setAttribute('role', 'status');
    item.node.setAttribute('aria-live', 'polite');
    panel.toolbar.insertItem(10, 'portable-kernel-status', item);
    this._status.set(panel, item);
    panel.disposed.connect(() => this._status.delete(panel));
    panel.sessionContext.kernelChanged.connect(() => this._render());
    // which kernel answers now (the placeholder or the machine's), for the status and the tests
    const which = (status: string) => {
      if (status === 'connected') {
        void implementationOf(panel).then(async impl => {
          if (impl === PLACEHOLDER) {
            // before the first cell: the placeholder then holds it while the user answers
            await tellPlaceholder(panel, { asker: true });
          }
          item.node.dataset.kernel = impl;
        });
      } else {
        item.node.dataset.kernel = '';
      }
    };
    panel.sessionContext.connectionStatusChanged.connect((_, status) => which(status));
    void panel.sessionContext.ready.then(() => which(panel.sessionContext.session?.kernel?.connectionStatus ?? ''));
    this._render();
  }

  private _render(): void {
    for (const [panel, item] of this._status) {
      const text = this._portable(panel) ? this._notice || machineStatus(this.state, this.words) : '';
      item.node.textContent = text;
      item.node.title = text;
      item.node.dataset.state = this.state ?? '';
      item.setHidden(!text);
    }
    this._statusBarModel()?.stateChanged.emit();
  }

  /** JupyterLab's kernel item in the status bar, made to say the workspace's state where it has no
   * machine ("Python (portable) | No machine (LOST)", not "| Idle"): found once, among the status
   * bar's widgets, by its model. */
  private _statusBarModel(): IKernelStatusBarModel | null {
    if (this._statusBar) {
      return this._statusBar;
    }
    const found = findKernelStatusModel(this.app);
    if (!found) {
      return null; // not there yet: the next render looks again
    }
    const own = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(found), 'status');
    const kernelStatus = () => (own?.get ? (own.get.call(found) as string | undefined) : undefined);
    Object.defineProperty(found, 'status', {
      configurable: true,
      get: () => {
        const panel = this.tracker.find(p => p.sessionContext === found.sessionContext);
        return panel && this._portable(panel)
          ? statusBarText(kernelStatus(), this.state, this.words)
          : kernelStatus();
      }
    });
    this._statusBar = found;
    return found;
  }

  private _panelOf(notebook: Notebook): NotebookPanel | null {
    return this.tracker.find(p => p.content === notebook) ?? null;
  }

  private async _isPlaceholder(panel: NotebookPanel): Promise<boolean> {
    return (await implementationOf(panel)) === PLACEHOLDER;
  }

  private _onScheduled(notebook: Notebook, cellId: string): void {
    const panel = this._panelOf(notebook);
    if (!panel || !this._portable(panel) || this._running.has(cellId)) {
      return;
    }
    if (this._moving || (this.state && MOVING.includes(this.state))) {
      // the placeholder holds it; it runs again on the new kernel, in order
      this._held.push({ panel, cellId });
      return;
    }
    if (this._asks(this.state)) {
      // no machine yet, or released (an idle stop): the placeholder holds the cell while the
      // question is open, as for the first machine; Start runs it on the machine
      const holding = this._held.some(h => h.panel === panel);
      this._held.push({ panel, cellId });
      if (holding) {
        // its kernel is the placeholder, busy holding the cell before (a kernel_info would wait
        // behind it): ask again, this cell with it
        if (this._asking) {
          void tellPlaceholder(panel, ASKING);
        } else {
          void this._askFirstMachine();
        }
        return;
      }
      void this._isPlaceholder(panel).then(placeholder => {
        if (!placeholder) {
          this._held = this._held.filter(h => h.cellId !== cellId);
        } else if (this._asking) {
          void tellPlaceholder(panel, ASKING); // the routes are being read: it gets the same answer
        } else {
          void this._askFirstMachine();
        }
      });
    }
  }

  /** A cell run in ``state`` asks before renting (the server's words say ``ask``: IDLE, RELEASED). */
  private _asks(state: string | null): boolean {
    if (!state) {
      return false;
    }
    const said = this.words?.[state as LifecycleState];
    return said ? said.ask : state === 'IDLE';
  }

  /** End the held first cells (Cancel, or a start that failed): each gets an output saying why. */
  private _endHeld(answer: 'cancel' | 'failed', reason = '', route?: IRouteFacts | null): void {
    const panels = new Set(this._held.map(h => h.panel));
    this._held = [];
    // the route the question named goes with the answer: the output names the machine the user refused
    const content = route === undefined ? { answer, reason } : { answer, reason, route };
    for (const panel of panels) {
      void tellPlaceholder(panel, content);
    }
  }

  /** Tell the placeholder kernels that hold a first cell (``{asking}``, ``{route}``). */
  private _tellHeld(content: { [key: string]: unknown }): void {
    for (const panel of new Set(this._held.map(h => h.panel))) {
      void tellPlaceholder(panel, content);
    }
  }

  /** Close the open question without an answer (it is asked again, or no longer stands). */
  private _dropQuestion(): void {
    const id = this._question;
    this._question = null; // first: its removal is then not taken for the user's Dismiss
    if (id) {
      Notification.dismiss(id);
    }
  }

  private async _askFirstMachine(): Promise<void> {
    if (this._asking) {
      return;
    }
    this._asking = true;
    // a question still open (hidden, or left from before) is asked again, with the routes as they are now
    this._dropQuestion();
    this._tellHeld(ASKING);
    let route: { id: string; text: string } | null = null;
    let why = 'no route is open now: see the routes in the portable sidebar';
    let facts: IRouteFacts | null = null;
    try {
      const answer = await this.client.routes(8);
      const best = answer.routes.find(r => r.id === answer.best) ?? null;
      if (best) {
        route = { id: best.id, text: firstMachineQuestion(best, this.state) };
        facts = {
          id: best.id,
          gpu: best.gpu,
          gpu_count: best.gpu_count,
          provider: best.provider,
          offer: best.offer,
          region: best.region,
          price_per_hour: best.price_per_hour
        };
      } else if (answer.routes.length && answer.routes[0].blocked) {
        why = `no route is open: ${answer.routes[0].provider}/${answer.routes[0].offer} ${answer.routes[0].blocked}`;
      }
    } catch (reason) {
      why = `the routes could not be read: ${errorText(reason)}`;
    }
    // the route as it is now: what the held cell's output names, however it ends
    this._tellHeld({ route: facts });
    const start = () => {
      this._question = null;
      this._asking = false;
      this._moving = true;
      this._render();
      this.client.continue(route ? route.id : null).catch(reason => {
        this._moving = false;
        const text = errorText(reason);
        this._endHeld('failed', text);
        this._render();
        Notification.error(`The first machine did not start: ${text}`, { autoClose: 10000 });
      });
    };
    if (!route) {
      this._asking = false;
      this._endHeld('failed', why);
      Notification.error(`No GPU machine was started: ${why}`, { autoClose: 10000 });
      return;
    }
    if (!this.options.confirmFirstMachine()) {
      start();
      return;
    }
    this._questionRoute = facts;
    this._question = Notification.info(route.text, {
      autoClose: false,
      actions: [
        { label: 'Start', callback: start, displayType: 'accent' },
        {
          label: 'Cancel',
          callback: () => {
            this._question = null;
            this._asking = false;
            this._endHeld('cancel', '', facts);
          }
        }
      ]
    });
    this._asking = false;
  }

  private _onEvent(_: unknown, emission: Event.Emission): void {
    const id = emission.schema_id;
    const workspace = emission['workspace_id'];
    if (this.workspaceId && workspace && workspace !== this.workspaceId) {
      return;
    }
    if (id === STATE_SCHEMA) {
      this.state = String(emission['state']);
      if (this.state !== 'ACTIVE') {
        this._notice = ''; // "Now on ..." never stays next to a newer state
      }
      if (MOVING.includes(this.state) || this.state === 'ACTIVE') {
        this._moving = this._moving || this.state !== 'ACTIVE';
        // a Continue begun elsewhere (the sidebar, a terminal): the question no longer stands
        this._dropQuestion();
      } else if (this.state === 'FAILED' || this.state === 'LOST') {
        // the Continue did not get there: the held cells will not run
        this._moving = false;
        this._held = [];
      } else if (NO_MACHINE.includes(this.state)) {
        // back with no machine (a Continue cancelled, a stop): nothing is moving any more, and the
        // next cell asks again; the placeholder ends what it held
        this._moving = false;
      }
      this._render();
    } else if (id === NOTICE_SCHEMA && emission['kind'] === 'moved') {
      void this._afterMove(String(emission['message']));
    } else if (id === PROGRESS_SCHEMA && emission['step'] === 'follow') {
      // the server pulled what the kernel wrote on the machine: show it now, not at the next 10 s poll
      if (this.app.commands.hasCommand('filebrowser:refresh')) {
        void this.app.commands.execute('filebrowser:refresh').catch(() => undefined);
      }
    }
  }

  private _running = new Set<string>();

  private async _afterMove(message: string): Promise<void> {
    this._moving = false;
    this.state = 'ACTIVE';
    this._notice = message;
    this._render();
    Notification.info(message, { autoClose: 8000 });
    window.setTimeout(() => {
      this._notice = '';
      this._render();
    }, 10000);
    const held = this._held;
    this._held = [];
    const panels: NotebookPanel[] = [];
    this.tracker.forEach(p => {
      if (this._portable(p)) {
        panels.push(p);
      }
    });
    for (const panel of panels) {
      if (!(await this._connected(panel))) {
        Notification.warning(
          `${panel.context.path}: the kernel did not reconnect to the new machine within ` +
            `${RECONNECT_TIMEOUT_MS / 1000} s, so the cells waiting for the move (held, or tagged ` +
            `${RESUME_TAG}) did not run. Reconnect the kernel from the Kernel menu, then run them.`,
          { autoClose: false }
        );
        continue;
      }
      const resumed = await this._resume(panel);
      if (resumed === false) {
        continue; // a resume cell failed: the user's queued cells wait for them
      }
      for (const h of held.filter(h => h.panel === panel)) {
        if (!(await this._run(panel, h.cellId))) {
          break;
        }
      }
    }
  }

  /** The kernel reconnected to its new ports and is the real one, not the placeholder. */
  private async _connected(panel: NotebookPanel, timeoutMs = RECONNECT_TIMEOUT_MS): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const kernel = panel.sessionContext.session?.kernel;
      if (kernel && kernel.connectionStatus === 'connected') {
        const impl = await implementationOf(panel);
        if (impl && impl !== PLACEHOLDER) {
          return true;
        }
      } else if (kernel && kernel.connectionStatus === 'disconnected' && !kernel.isDisposed) {
        // JupyterLab gives up after 7 tries in a row (a slow server mid-move): try again
        await kernel.reconnect().catch(() => undefined);
      }
      await new Promise(resolve => window.setTimeout(resolve, 200));
    }
    return false;
  }

  private async _run(panel: NotebookPanel, cellId: string): Promise<boolean> {
    const notebook = panel.content;
    const index = notebook.widgets.findIndex(c => c.model.id === cellId);
    if (index < 0) {
      return true;
    }
    this._running.add(cellId);
    try {
      notebook.deselectAll();
      notebook.activeCellIndex = index;
      return await NotebookActions.run(notebook, panel.sessionContext);
    } finally {
      this._running.delete(cellId);
    }
  }

  /** Run the portable-resume cells in order; null when there are none, else whether all passed. */
  private async _resume(panel: NotebookPanel): Promise<boolean | null> {
    const ids = panel.content.widgets
      .filter(c => c.model.type === 'code' && tagsOf(c.model.getMetadata('tags')).includes(RESUME_TAG))
      .map(c => c.model.id);
    if (!ids.length) {
      return null;
    }
    const active = panel.content.activeCellIndex;
    const t0 = performance.now();
    let failed: number | null = null;
    let ran = 0;
    for (const [i, id] of ids.entries()) {
      ran++;
      if (!(await this._run(panel, id))) {
        failed = i + 1;
        break;
      }
    }
    panel.content.activeCellIndex = active;
    const text = resumedText(ran, (performance.now() - t0) / 1000, failed);
    if (failed !== null) {
      Notification.error(`${panel.context.path}: ${text}`, { autoClose: false });
    }
    this._notice = text;
    this._render();
    try {
      await this.app.serviceManager.events.emit({
        schema_id: PROGRESS_SCHEMA,
        version: '1',
        data: { workspace_id: this.workspaceId ?? '', step: 'reconnect', message: text, done: ran, total: ids.length }
      });
    } catch (reason) {
      console.warn('jupyter-portable: the resume was not told to the sidebar', reason);
    }
    return failed === null;
  }

  /** `%workspace resume-tag` sends a display of TAG_MIME: the tag goes on the cell that ran it. */
  private _applyResumeTag(cell: { model: { type: string; getMetadata(k: string): unknown; setMetadata(k: string, v: unknown): void } }): void {
    if (cell.model.type !== 'code') {
      return;
    }
    const outputs = (cell.model as unknown as { outputs?: { toJSON(): Array<{ data?: { [k: string]: unknown } }> } }).outputs;
    const asked = outputs?.toJSON().find(o => o.data && TAG_MIME in o.data)?.data?.[TAG_MIME] as { on?: boolean } | undefined;
    if (!asked) {
      return;
    }
    const tags = tagsOf(cell.model.getMetadata('tags')).filter(t => t !== RESUME_TAG);
    if (asked.on !== false) {
      tags.push(RESUME_TAG);
    }
    cell.model.setMetadata('tags', tags);
  }
}

/** Tell the notebook's placeholder kernel about the first machine (a control message: it is
 * answered while the held cell waits on the shell channel). */
async function tellPlaceholder(panel: NotebookPanel, content: { [key: string]: unknown }): Promise<void> {
  const kernel = panel.sessionContext.session?.kernel;
  if (!kernel) {
    return;
  }
  try {
    const msg = KernelMessage.createMessage({
      channel: 'control',
      msgType: FIRST_MACHINE_MSG as 'interrupt_request',
      session: kernel.clientId,
      username: kernel.username,
      content: content as KernelMessage.IInterruptRequestMsg['content']
    });
    const future: Kernel.IControlFuture = kernel.sendControlMessage(msg, true, true);
    await Promise.race([future.done, new Promise(resolve => window.setTimeout(resolve, 10000))]);
  } catch (reason) {
    console.warn('jupyter-portable: the placeholder kernel was not told', content, reason);
  }
}

function errorText(reason: unknown): string {
  if (reason instanceof PortableApiError) {
    return reason.full;
  }
  return reason instanceof Error ? reason.message : String(reason);
}

/** The kernel's implementation as it answers now (bounded: see kernelInfo.ts). */
async function implementationOf(panel: NotebookPanel): Promise<string> {
  return askImplementation(panel.sessionContext.session?.kernel);
}

function tagsOf(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((t): t is string => typeof t === 'string') : [];
}
