/**
 * What a notebook on the portable kernel says of its machine (issue 43 item 7): the words in its
 * toolbar ("No machine (LOST)", "Moving to a new machine (...)"), what JupyterLab's status bar says
 * after the kernel's name, and the line after the resume cells ran. The states come from the
 * server's core/lifecycle.py (generated into types.ts), their words from core/state_words.py.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { CONTINUE_FROM, CONTINUE_STATES, IPortableState, LifecycleState } from './types';

/** Every state's words, as the server sends them with the state. */
export type StateWordsTable = NonNullable<IPortableState['states']>;

/** The states with no machine (a Continue may begin from them) and those of a move, as the server's
 * core/lifecycle.py says (generated into types.ts). */
export const NO_MACHINE: readonly string[] = CONTINUE_FROM;
export const MOVING: readonly string[] = CONTINUE_STATES;

/** What the notebook's kernel status says for a workspace state ('' when it has a machine);
 * ``words``: the server's words for the states (core/state_words.py), once known. */
export function machineStatus(state: string | null, words?: StateWordsTable | null): string {
  const said = state ? words?.[state as LifecycleState] : undefined;
  if (said) {
    return state === 'ACTIVE' ? '' : said.label;
  }
  if (state && NO_MACHINE.includes(state)) {
    return state === 'IDLE' ? 'No machine yet' : `No machine (${state})`;
  }
  if (state && MOVING.includes(state)) {
    return `Moving to a new machine (${state})`;
  }
  return '';
}

/** What JupyterLab's status bar says after the kernel's name ("Python (portable) | ..."): the
 * kernel's own status while the workspace has a machine or is moving to one, the words of the
 * state where it has none ("No machine (LOST)"): the placeholder kernel is idle, the work is not.
 * ``kernelStatus``: JupyterLab's words for the kernel's status. */
export function statusBarText(
  kernelStatus: string | undefined,
  state: string | null,
  words?: StateWordsTable | null
): string | undefined {
  if (state && NO_MACHINE.includes(state)) {
    return machineStatus(state, words) || kernelStatus;
  }
  return kernelStatus;
}

/** "resumed: 3 cells, 4.2 s" */
export function resumedText(cells: number, seconds: number, failed: number | null): string {
  const base = `resumed: ${cells} cell${cells === 1 ? '' : 's'}, ${seconds.toFixed(1)} s`;
  return failed === null ? base : `${base}; resume cell ${failed} failed, the rest did not run`;
}

/** The model of JupyterLab's kernel item in the status bar (apputils' KernelStatus.Model): what of it
 * this reads and re-renders. */
export interface IKernelStatusBarModel {
  readonly status: string | undefined;
  readonly sessionContext: ISessionContext | null;
  readonly stateChanged: { emit(value: void): void };
}

/** The model of JupyterLab's kernel item in the status bar, among the widgets of the shell's bottom
 * area (the status bar), known by what it has; null before the status bar has it. */
export function findKernelStatusModel(app: JupyterFrontEnd): IKernelStatusBarModel | null {
  const seen = (w: Widget): IKernelStatusBarModel | null => {
    const model = (w as unknown as { model?: unknown }).model;
    if (model && typeof model === 'object' && 'sessionContext' in model && 'kernelName' in model && 'activityName' in model) {
      return model as unknown as IKernelStatusBarModel;
    }
    for (const child of w.children()) {
      const found = seen(child);
      if (found) {
        return found;
      }
    }
    return null;
  };
  for (const widget of app.shell.widgets('bottom')) {
    const found = seen(widget);
    if (found) {
      return found;
    }
  }
  return null;
}
