import { Button } from '@jupyterlab/ui-components';
import React from 'react';

import * as fmt from '../format';
import { IStatus } from '../model';
import { IContinueProgress, STEP_LABEL, STEPS, stepFraction, stepSeconds } from '../progress';
import { machineName, routeName as routeLabel } from '../routes';
import { IPortableState, IRoute, IRoutesAnswer } from '../types';
import { Section, StatusLine } from './common';
import { runningLine, safeVersion } from './WorkspacePanel';

const STATUS_WORD = { pending: 'waiting', running: 'running', done: 'done', failed: 'failed' } as const;

/** A step's message with allocation ids put in words and long paths shortened. */
function humanMessage(message: string, state: IPortableState): React.ReactNode {
  const a = state.allocation;
  const words = (text: string) => {
    let out = text;
    if (a?.allocation_id && (a.gpu || a.provider)) {
      out = out.split(a.allocation_id).join(machineName(a));
    }
    return out.replace(/\bal-[0-9a-f]{6,}\b/g, 'the new machine');
  };
  // a path keeps its ids (it is a path); it is shortened, whole on hover
  const path = /(\/[^\s:,;]+){3,}/.exec(message);
  if (!path) {
    return words(message);
  }
  return (
    <>
      {words(message.slice(0, path.index))}
      <span className="jp-Portable-path" title={path[0]}>
        {fmt.shortPath(path[0])}
      </span>
      {words(message.slice(path.index + path[0].length))}
    </>
  );
}

/** The words of a move in progress, as the server says them (core/state_words.MOVE_WORDS). */
export function moveWords(state: IPortableState): string {
  return state.lifecycle.move ?? (isFirstStart(state) ? 'Starting the first machine' : 'Continuing');
}

/** No machine served the workspace before this one: a first start, not a move (the server's
 * lifecycle.move says it where given). */
export function isFirstStart(state: IPortableState): boolean {
  if (state.lifecycle.move) {
    return state.lifecycle.move !== 'Continuing';
  }
  const machines = (state.machines ?? []).filter(m => m.state !== 'failed' && m.state !== 'refused');
  return machines.length <= (state.allocation ? 1 : 0) && state.lifecycle.state !== 'LOST';
}

/** "Ready after 42 s: 5 steps done, 1 route given up", or "Failed at Materialize the workspace". */
export function finishedSummary(progress: IContinueProgress): string {
  const n = progress.failovers.length;
  const given = n ? `, ${n} route${n === 1 ? '' : 's'} given up` : '';
  if (progress.outcome === 'failed') {
    const at = STEPS.find(step => progress.steps[step].status === 'failed');
    return `Failed${at ? ` at ${STEP_LABEL[at]}` : ''}${given}`;
  }
  const done = STEPS.filter(step => progress.steps[step].status === 'done');
  // from the first step's start to the last one's end, as the events tell them
  const starts = done.map(step => Date.parse(progress.steps[step].started ?? '')).filter(t => !Number.isNaN(t));
  const ends = done.map(step => Date.parse(progress.steps[step].ended ?? '')).filter(t => !Number.isNaN(t));
  const took = starts.length && ends.length ? Math.max(0, (Math.max(...ends) - Math.min(...starts)) / 1000) : null;
  const after = took === null ? 'Ready' : `Ready after ${fmt.duration(took)}`;
  return `${after}: ${done.length} step${done.length === 1 ? '' : 's'} done${given}`;
}

/** "The workspace is RELEASED: the workspace was sealed ...", in the server's words for the state. */
function workspaceIs(state: IPortableState): string {
  const words = state.states?.[state.lifecycle.state];
  return `The workspace is ${state.lifecycle.state}` + (words ? `: ${words.meaning}.` : '.');
}

function describe(id: string | null, answer: IRoutesAnswer | null): string {
  if (!id) {
    return '—';
  }
  const route: IRoute | undefined = answer?.routes.find(r => r.id === id);
  return route ? routeLabel(route) : id;
}

/** Continue on the chosen route, step by step, with Cancel. */
export function ContinuePanel(props: {
  state: IPortableState;
  progress: IContinueProgress;
  routes: IRoutesAnswer | null;
  selected: string | null;
  canContinue: boolean;
  busy: { continue: boolean; cancel: boolean; stop: boolean };
  status: { continue?: IStatus; cancel?: IStatus; stop?: IStatus };
  onContinue: () => void;
  onCancel: () => void;
  onStop: () => void;
}): JSX.Element {
  const { progress, routes } = props;
  const route = routes?.routes.find(r => r.id === props.selected) ?? null;
  const running = progress.running || props.state.continuing;
  const showSteps = running || progress.outcome !== null || progress.failovers.length > 0;
  const first = isFirstStart(props.state);
  const now = Date.now();
  const readyNote = fmt.readyLine(props.state.allocation?.estimate);
  const envNote = fmt.environmentLine(props.state.allocation?.environment);
  // once finished, the step log folds into a one-line summary, opened on demand
  const finished = !running && progress.outcome !== null;
  const steps = (
    <ol className="jp-Portable-steps" aria-label="Continue progress">
      {STEPS.map(step => {
        const s = progress.steps[step];
        const fraction = stepFraction(s);
        const took = stepSeconds(s, now);
        return (
          <li key={step} className={`jp-Portable-step jp-mod-${s.status}`} data-step={step} aria-current={s.status === 'running' ? 'step' : undefined}>
            <span className="jp-Portable-stepMark" aria-hidden="true">
              {s.status === 'done' ? '✓' : s.status === 'failed' ? '✗' : s.status === 'running' ? '…' : '○'}
            </span>
            <span className="jp-Portable-stepLabel">{STEP_LABEL[step]}</span>
            <span className="jp-Portable-sr">: {STATUS_WORD[s.status]}</span>
            {took !== null && s.status !== 'pending' ? (
              <span className="jp-Portable-stepTime"> {fmt.duration(took)}</span>
            ) : null}
            {s.message ? <span className="jp-Portable-stepMessage">{humanMessage(s.message, props.state)}</span> : null}
            {s.status === 'running' && fraction !== null ? (
              <progress max={1} value={fraction} aria-label={`${STEP_LABEL[step]} progress`} />
            ) : null}
          </li>
        );
      })}
    </ol>
  );
  const failovers = progress.failovers.length ? (
    <ul className="jp-Portable-failovers" aria-label="routes given up">
      {progress.failovers.map((f, i) => (
        <li key={`${f.route}-${i}`}>
          {describe(f.route, routes)} failed: {f.reason}
          {f.next ? <> — trying {describe(f.next, routes)} next</> : null}
        </li>
      ))}
    </ul>
  ) : null;
  return (
    <Section id="continue" title="Continue">
      {!running && !props.state.can_continue ? (
        <div className="jp-Portable-row">
          <p className="jp-Portable-grow">
            {runningLine(props.state) ?? workspaceIs(props.state)}
          </p>
          {props.state.lifecycle.state === 'ACTIVE' ? (
            <Button
              className="jp-mod-styled"
              disabled={props.busy.stop}
              onClick={props.onStop}
              title="Seal the workspace (publish and read back its final version), then release the machine"
            >
              {props.busy.stop ? 'Stopping…' : 'Stop'}
            </Button>
          ) : null}
        </div>
      ) : !running ? (
        <div className="jp-Portable-row">
          <p className="jp-Portable-grow">
            {route ? (
              <>
                On <strong>{routeLabel(route)}</strong>: {fmt.money(route.cost.total)} for {routes?.hours} h, ready in ~
                {fmt.duration(route.time_to_ready_s)}
              </>
            ) : (
              'No route can be taken now.'
            )}
          </p>
          <Button
            className="jp-mod-styled jp-mod-accept jp-Portable-continue"
            disabled={!props.canContinue || !route || props.busy.continue}
            onClick={props.onContinue}
            aria-label={route ? `Continue on ${routeLabel(route)}` : 'Continue'}
          >
            Continue
          </Button>
        </div>
      ) : (
        <div className="jp-Portable-row">
          <p className="jp-Portable-grow" role="status">
            {moveWords(props.state)} on <strong>{describe(progress.route, routes)}</strong> (
            {progress.state ?? 'starting'})
          </p>
          <Button
            className="jp-mod-styled jp-mod-reject"
            disabled={props.busy.cancel}
            onClick={props.onCancel}
            aria-label="Cancel the Continue"
          >
            Cancel
          </Button>
        </div>
      )}
      {/* a refusal shows where the user is looking: under the button that was pressed */}
      <StatusLine status={props.status.continue} />
      <StatusLine status={props.status.cancel} />
      <StatusLine status={props.status.stop} />
      {showSteps && finished ? (
        <details className="jp-Portable-log" data-outcome={progress.outcome ?? ''}>
          <summary>{finishedSummary(progress)}</summary>
          {steps}
          {failovers}
        </details>
      ) : null}
      {showSteps && !finished ? steps : null}
      {!finished ? failovers : null}
      {progress.outcome === 'ready' ? (
        <p className="jp-Portable-status jp-Portable-status-info" role="status">
          {first
            ? "Ready: the first machine read the workspace back and it matched; the notebook's kernel runs there."
            : "Ready: the new machine read the workspace back and it matched; the notebook's kernel runs there."}
          {readyNote ? ` It was ${readyNote}.` : null}
        </p>
      ) : null}
      {envNote && (progress.outcome === 'ready' || props.state.lifecycle.state === 'ACTIVE') ? (
        <p className="jp-Portable-status jp-Portable-status-info jp-Portable-envNote" role="note"
          title={(props.state.allocation?.environment?.changes ?? []).map(fmt.envChangeLine).join('\n')}>
          {envNote}
        </p>
      ) : null}
      {progress.outcome === 'failed' ? (
        <p className="jp-Portable-status jp-Portable-status-error" role="alert">
          Continue failed: {progress.reason}. The workspace stays at version {safeVersion(props.state)}.
        </p>
      ) : null}
    </Section>
  );
}
