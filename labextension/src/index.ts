/**
 * The jupyter-portable lab extension: a left sidebar showing the workspace, its machine,
 * where the work could continue and at what cost, Continue, and reservations.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { NotebookActions } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { PortableClient } from './api';
import { INotifier, PortableModel } from './model';
import { readSettings } from './settings';
import { PortableSidebar } from './widget';

const PLUGIN_ID = 'jupyter-portable:plugin';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M4 5h12v10H4z" fill="none" stroke="#616161" stroke-width="2"/>
    <path d="M7 15v2M10 15v2M13 15v2M7 3v2M10 3v2M13 3v2"/>
    <path d="M7 15v2M10 15v2M13 15v2M7 3v2M10 3v2M13 3v2" stroke="#616161" stroke-width="1.5"/>
    <path d="M15 19h6m-3-3 3 3-3 3" fill="none" stroke="#616161" stroke-width="2"/>
  </g>
</svg>`;

export const portableIcon = new LabIcon({ name: 'jupyter-portable:icon', svgstr: ICON_SVG });

export namespace CommandIDs {
  export const open = 'jupyter-portable:open';
  export const snapshot = 'jupyter-portable:snapshot';
  export const refresh = 'jupyter-portable:refresh';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The workspace, its GPU, routes and costs, Continue and reservations.',
  autoStart: true,
  optional: [ISettingRegistry, ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const showSidebar = () => app.shell.activateById('jupyter-portable-sidebar');
    // The loss stays on screen until the work is Ready again.
    let lostNotice: string | null = null;
    const notifier: INotifier = {
      notice(kind, message) {
        switch (kind) {
          case 'lost':
            showSidebar();
            lostNotice = Notification.error(`GPU lost: ${message}`, {
              autoClose: false,
              actions: [{ label: 'Show routes', callback: showSidebar }]
            });
            break;
          case 'ready':
            if (lostNotice) {
              Notification.dismiss(lostNotice);
              lostNotice = null;
            }
            Notification.success(message, { autoClose: 8000 });
            break;
          case 'failed':
            Notification.error(`Continue failed: ${message}`, {
              autoClose: false,
              actions: [{ label: 'Show', callback: showSidebar }]
            });
            break;
          default:
            Notification.warning(message, { autoClose: 10000 });
        }
      },
      error(message) {
        Notification.error(message, { autoClose: 10000 });
      }
    };

    const client = new PortableClient(app.serviceManager.serverSettings);
    const model = new PortableModel(client, app.serviceManager.events.stream, notifier);
    const openSettings = () =>
      void app.commands.execute('settingeditor:open', { query: 'jupyter-portable' });
    const sidebar = new PortableSidebar(model, openSettings);
    sidebar.title.icon = portableIcon;
    sidebar.title.caption = 'jupyter-portable: workspace, GPU, routes';
    app.shell.add(sidebar, 'left', { rank: 250 });
    restorer?.add(sidebar, 'jupyter-portable-sidebar');

    app.commands.addCommand(CommandIDs.open, {
      label: 'Portable: Show the Workspace Sidebar',
      execute: showSidebar
    });
    app.commands.addCommand(CommandIDs.snapshot, {
      label: 'Portable: Snapshot the Workspace',
      execute: () => model.snapshot('from the command palette')
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Portable: Refresh Routes and Reservations',
      execute: () => Promise.all([model.refreshState(), model.refreshRoutes(), model.refreshReservations()])
    });
    for (const command of Object.values(CommandIDs)) {
      palette?.addItem({ command, category: 'Portable' });
    }

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () =>
            void model
              .applySettings(readSettings(settings.composite as { [key: string]: unknown }))
              .catch(reason => console.error('jupyter-portable: cannot apply settings', reason));
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.error('jupyter-portable: cannot read settings', reason));
    }

    // A cell can change the workspace without a lifecycle event (`%workspace checkpoint`,
    // `%workspace snapshot` run on the worker): read the state once after each cell ends.
    NotebookActions.executed.connect(() => void model.refreshState());
    // Starting the notebook's portable kernel may start the workspace's first machine.
    app.serviceManager.kernels.runningChanged.connect(() => void model.refreshState());

    void app.restored.then(() => model.start());
  }
};

export default plugin;
