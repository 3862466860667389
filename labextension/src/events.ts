/**
 * The events the server extension emits (docs/api.md, "Events";
 * jupyter_portable/interfaces/serverext/events/*.yaml), as the sidebar reads them. Their
 * shapes, step names, kinds and schema ids are generated into types.ts from those files.
 */

import { IChangedEvent, ILifecycleEvent, INoticeEvent, IProgressEvent } from './types';

export { CHANGED_SCHEMA, NOTICE_SCHEMA, PROGRESS_SCHEMA, STATE_SCHEMA } from './types';
export type { IChangedEvent, INoticeEvent, IProgressEvent };

/** A state/v1 event: a lifecycle event (state.json) of one workspace. */
export interface IStateEvent extends ILifecycleEvent {
  workspace_id: string;
}
