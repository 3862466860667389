/**
 * The events the server extension emits (docs/api.md, "Events";
 * jupyter_portable/interfaces/serverext/events/*.yaml), as the sidebar reads them.
 */

import { ILifecycleEvent } from './types';

export const STATE_SCHEMA = 'https://events.jupyter-portable.org/state/v1';
export const PROGRESS_SCHEMA = 'https://events.jupyter-portable.org/progress/v1';
export const NOTICE_SCHEMA = 'https://events.jupyter-portable.org/notice/v1';

export interface IStateEvent extends ILifecycleEvent {
  workspace_id: string;
}

export type ProgressStep =
  | 'acquire'
  | 'probe'
  | 'materialize'
  | 'verify'
  | 'reconnect'
  | 'snapshot'
  | 'seal'
  | 'follow';

export interface IProgressEvent {
  workspace_id: string;
  step: ProgressStep;
  message: string;
  done: number | null;
  total: number | null;
}

export type NoticeKind = 'lost' | 'ready' | 'failed' | 'conflict' | 'budget' | 'idle' | 'moved';

export interface INoticeEvent {
  workspace_id: string;
  kind: NoticeKind;
  message: string;
}
