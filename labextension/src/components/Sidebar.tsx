import React from 'react';

import * as fmt from '../format';
import { PortableModel } from '../model';
import { machineName } from '../routes';
import { ApiErrorLine, StatusLine } from './common';
import { confirmAction, confirmStop } from './confirm';
import { ContinuePanel } from './ContinuePanel';
import { IdleCountdown } from './IdleCountdown';
import { OrphansPanel } from './OrphansPanel';
import { ReservationsPanel } from './ReservationsPanel';
import { RoutesPanel } from './RoutesPanel';
import { CheckpointsPanel, SnapshotPanel } from './SnapshotPanel';
import { AllocationPanel, LostBanner, MachinesPanel, WorkspaceHeader } from './WorkspacePanel';

/** The whole sidebar, drawn from the model. */
export function Sidebar(props: { model: PortableModel; now: number; onOpenSettings?: () => void }): JSX.Element {
  const { model, now } = props;
  const state = model.state;
  if (!state) {
    return (
      <div className="jp-Portable-body">
        <h2 className="jp-Portable-title">jupyter-portable</h2>
        {model.stateError ? <ApiErrorLine error={model.stateError} /> : <p role="status">Loading the workspace…</p>}
      </div>
    );
  }
  const settings = model.settings;
  return (
    <div className="jp-Portable-body" data-state={state.lifecycle.state}>
      <h2 className="jp-Portable-title">jupyter-portable</h2>
      <div className="jp-Portable-top">
        <LostBanner state={state} />
        {model.stateError ? <ApiErrorLine error={model.stateError} /> : null}
        <ContinuePanel
          state={state}
          progress={model.progress}
          routes={model.routes}
          selected={model.selectedRoute}
          canContinue={model.canContinue}
          busy={{ continue: model.busy.has('continue'), cancel: model.busy.has('cancel'), stop: model.busy.has('stop') }}
          status={{ continue: model.status.continue, cancel: model.status.cancel, stop: model.status.stop }}
          onContinue={() => void model.continueWork()}
          onCancel={() => void model.cancelContinue()}
          onStop={() =>
            void confirmStop(state.allocation ? machineName(state.allocation) : null).then(ok =>
              ok ? model.stop() : undefined
            )
          }
        />
      </div>
      <AllocationPanel state={state} now={now} fetchedAt={model.fetchedAt} />
      <IdleCountdown model={model} now={now} />
      <OrphansPanel model={model} />
      <RoutesPanel
        answer={model.routes}
        error={model.routesError}
        loading={model.busy.has('routes')}
        selected={model.selectedRoute}
        hours={model.hours}
        disabled={!model.canContinue}
        onSelect={id => model.selectRoute(id)}
        onRefresh={h => void model.refreshRoutes(h)}
      />
      <MachinesPanel state={state} now={now} />
      <SnapshotPanel
        state={state}
        now={now}
        busy={model.busy.has('snapshot')}
        status={model.status.snapshot}
        progress={model.otherProgress}
        onSnapshot={m => void model.snapshot(m)}
      />
      <CheckpointsPanel state={state} now={now} />
      <ReservationsPanel
        answer={model.reservations}
        error={model.reservationsError}
        routes={model.routes}
        now={now}
        budget={state.budget ?? null}
        settingsSeen={model.settingsSeen}
        busy={{ book: model.busy.has('book'), cancel: model.busy.has('cancel-booking') }}
        status={{ book: model.status.book, cancel: model.status['cancel-booking'] }}
        onBook={r => model.book(r)}
        onCheck={model.checkBooking}
        onCancel={(id, what) =>
          void confirmAction(
            'Cancel this reservation?',
            `${what}. The slot is given back and cannot be restored; book it again if it is still free.`,
            'Cancel reservation'
          ).then(ok => (ok ? model.cancelBooking(id) : undefined))
        }
      />
      <WorkspaceHeader state={state} />
      <footer className="jp-Portable-settings" aria-label="settings">
        <span>
          Budget cap {settings.budgetCap !== null ? fmt.money(settings.budgetCap) : 'none'} · driver{' '}
          {settings.pinnedDriver || 'any'} · auto-snapshot{' '}
          {settings.autoSnapshotMinutes === null
            ? "the machine's default"
            : settings.autoSnapshotMinutes
              ? `every ${settings.autoSnapshotMinutes} min`
              : 'off'}
          {settings.storeUrl ? ` · store URL for new workspaces ${settings.storeUrl}` : ''}
        </span>
        {props.onOpenSettings ? (
          <button type="button" className="jp-Portable-link" onClick={props.onOpenSettings}>
            Settings…
          </button>
        ) : null}
        <StatusLine status={model.status.settings} />
      </footer>
    </div>
  );
}
