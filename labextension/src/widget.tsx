import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import React from 'react';

import { Sidebar } from './components/Sidebar';
import { PortableModel } from './model';

/** How often ages and uptime are redrawn; local only, the server is not asked. */
const TICK_MS = 15 * 1000;

/** The left sidebar: a ReactWidget redrawn on each model change and each local tick. */
export class PortableSidebar extends ReactWidget {
  constructor(
    readonly model: PortableModel,
    private readonly openSettings?: () => void
  ) {
    super();
    this.id = 'jupyter-portable-sidebar';
    this.addClass('jp-Portable');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'jupyter-portable workspace');
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._timer = window.setInterval(() => this.update(), TICK_MS);
    // Events may have been missed while hidden (a dropped websocket): read the state once.
    void this.model.refreshState();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    window.clearInterval(this._timer);
  }

  dispose(): void {
    window.clearInterval(this._timer);
    super.dispose();
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => <Sidebar model={this.model} now={Date.now()} onOpenSettings={this.openSettings} />}
      </UseSignal>
    );
  }

  private _timer = 0;
}
