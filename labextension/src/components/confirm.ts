/** Questions asked before what cannot be undone (JupyterLab's dialogs). */

import { Dialog, showDialog } from '@jupyterlab/apputils';

/** Ask before something that cannot be undone; true when the user confirmed. */
export async function confirmAction(title: string, body: string, accept: string): Promise<boolean> {
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton({ label: 'Keep' }), Dialog.warnButton({ label: accept })]
  });
  return result.button.accept;
}

/** Stop, asked first: it seals the workspace and releases (stops paying for) the machine. */
export function confirmStop(machine: string | null): Promise<boolean> {
  return confirmAction(
    'Stop the machine?',
    `The workspace is sealed (its final version published and read back), then ${machine ?? 'the machine'} is released: ` +
      'the kernel stops and billing ends. Continue starts a new machine later.',
    'Stop'
  );
}
