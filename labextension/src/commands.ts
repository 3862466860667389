/**
 * The sidebar's commands for the palette: Continue, Stop (asked first), Snapshot, Show routes,
 * and refresh. None has a default shortcut (issue 43: the keys browsers leave free are too few to
 * be sure of, docs/shortcuts.md); a user binds one in Settings > Settings Editor > Keyboard Shortcuts.
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

/** Where a command was run from, as a snapshot's message says it. */
export function snapshotMessage(args: { origin?: unknown } | undefined): string {
  return args?.origin === 'palette' ? 'from the command palette' : args?.origin === 'sidebar' ? 'from the sidebar' : 'from JupyterLab';
}

/** Add the commands and their palette entries. */
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
    // the palette says where it ran from (its item's args); a shortcut a user bound, or another caller, does not
    execute: args => model.snapshot(snapshotMessage(args as { origin?: unknown }))
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
    palette?.addItem({ command, category: 'Portable', args: { origin: 'palette' } });
  }
  model.changed.connect(() => commands.notifyCommandChanged());
}
