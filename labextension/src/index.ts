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
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { PortableClient } from './api';
import { addCommands } from './commands';
import { INotifier, PortableModel } from './model';
import { readSettings } from './settings';
import { IWorkspaceFields, mirrored } from './workspaceSettings';
import { PortableNotebooks } from './notebook';
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

export { CommandIDs } from './commands';

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
    // "Unreachable since 14:02Z" stays on screen until the machine answers again (or is lost).
    let unreachableNotice: string | null = null;
    const dismissUnreachable = () => {
      if (unreachableNotice) {
        Notification.dismiss(unreachableNotice);
        unreachableNotice = null;
      }
    };
    const notifier: INotifier = {
      notice(kind, message) {
        switch (kind) {
          case 'unreachable':
            dismissUnreachable();
            unreachableNotice = Notification.warning(message, { autoClose: false });
            break;
          case 'reachable':
            dismissUnreachable();
            Notification.success(message, { autoClose: 8000 });
            break;
          case 'lost':
            dismissUnreachable();
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
          case 'moved':
            // the notebooks tell it ("Now on ...", notebook.ts); the server sends no "Ready on ..." after it
            if (lostNotice) {
              Notification.dismiss(lostNotice);
              lostNotice = null;
            }
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
    // The Settings Editor shows the workspace's values: they are written into the user's settings
    // (one save) whenever the workspace's differ from what the registry holds.
    let registrySettings: ISettingRegistry.ISettings | null = null;
    const mirror = async (fields: IWorkspaceFields): Promise<void> => {
      if (!registrySettings) {
        return;
      }
      await registrySettings.save(JSON.stringify(mirrored(registrySettings.user, fields), null, 2));
    };
    const model = new PortableModel(client, app.serviceManager.events.stream, notifier, mirror);
    const openSettings = () =>
      void app.commands.execute('settingeditor:open', { query: 'jupyter-portable' });
    const sidebar = new PortableSidebar(model, openSettings);
    sidebar.title.icon = portableIcon;
    sidebar.title.caption = 'jupyter-portable: workspace, GPU, routes';
    app.shell.add(sidebar, 'left', { rank: 250 });
    restorer?.add(sidebar, 'jupyter-portable-sidebar');

    addCommands(app, model, palette, showSidebar);

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          registrySettings = settings;
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

const NOTEBOOK_PLUGIN_ID = 'jupyter-portable:notebook';

/** The notebook side of a Continue: kernel status, held cells, the move notice, resume cells. */
const notebookPlugin: JupyterFrontEndPlugin<void> = {
  id: NOTEBOOK_PLUGIN_ID,
  description: 'No-machine status, cells held during a Continue, resume cells after it.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker, settingRegistry: ISettingRegistry | null) => {
    let confirm = true;
    settingRegistry
      ?.load(NOTEBOOK_PLUGIN_ID)
      .then(settings => {
        const read = () => (confirm = settings.composite['confirmFirstMachine'] !== false);
        read();
        settings.changed.connect(read);
      })
      .catch(reason => console.error('jupyter-portable: cannot read the notebook settings', reason));
    const client = new PortableClient(app.serviceManager.serverSettings);
    void app.restored.then(
      () => new PortableNotebooks(app, tracker, client, { confirmFirstMachine: () => confirm })
    );
  }
};

export default [plugin, notebookPlugin];
