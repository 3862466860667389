/**
 * The sidebar's commands for the palette and the keyboard: Continue, Stop (asked first),
 * Snapshot, Show routes, and refresh. Their shortcuts are in schema/plugin.json.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { confirmStop } from './components/confirm';
import { PortableModel } from './model';
import { machineName } from './routes';

export namespace CommandIDs {
  export const open = 'jupyter-portable:open';
  export const continueWork = 'jupyter-portable:continue';
  export const stop = 'jupyter-portable:stop';
  export const snapshot = 'jupyter-portable:snapshot';
  export const showRoutes = 'jupyter-portable:show-routes';
  export const refresh = 'jupyter-portable:refresh';
}

/** Add the commands, their palette entries and keyboard shortcuts. */
export function addCommands(
  app: JupyterFrontEnd,
  model: PortableModel,
  palette: ICommandPalette | null,
  showSidebar: () => void
): void {
  const { commands } = app;
  commands.addCommand(CommandIDs.open, {
    label: 'Portable: Show the Workspace Sidebar',
    execute: showSidebar
  });
  commands.addCommand(CommandIDs.continueWork, {
    label: 'Portable: Continue on the Chosen Route',
    caption: 'Start a machine on the route chosen in the sidebar (the best one unless you chose another)',
    isEnabled: () => model.canContinue && model.selectedRoute !== null,
    execute: async () => {
      showSidebar();
      await model.continueWork();
    }
  });
  commands.addCommand(CommandIDs.stop, {
    label: 'Portable: Stop (Seal and Release the Machine)',
    isEnabled: () => model.state?.lifecycle.state === 'ACTIVE',
    execute: async () => {
      const a = model.state?.allocation;
      if (await confirmStop(a ? machineName(a) : null)) {
        await model.stop();
      }
    }
  });
  commands.addCommand(CommandIDs.snapshot, {
    label: 'Portable: Snapshot the Workspace',
    execute: () => model.snapshot('from the command palette')
  });
  commands.addCommand(CommandIDs.showRoutes, {
    label: 'Portable: Show Routes',
    execute: async () => {
      showSidebar();
      await model.refreshRoutes();
      document.querySelector('#jupyter-portable-sidebar .jp-Portable-routes')?.scrollIntoView({ block: 'start' });
    }
  });
  commands.addCommand(CommandIDs.refresh, {
    label: 'Portable: Refresh Routes and Reservations',
    execute: () => Promise.all([model.refreshState(), model.refreshRoutes(), model.refreshReservations()])
  });
  for (const command of Object.values(CommandIDs)) {
    palette?.addItem({ command, category: 'Portable' });
  }
  // The keyboard shortcuts are declared in schema/plugin.json ("jupyter.lab.shortcuts"), so they
  // are in JupyterLab's own shortcut registry and its Settings Editor, where a user can change them.
  model.changed.connect(() => commands.notifyCommandChanged());
}
