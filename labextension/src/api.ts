/**
 * The one way the sidebar talks to the server extension: ``requestAPI`` turns every HTTP
 * failure into a PortableApiError carrying the status, the server's one-line error and
 * its hint; a 404 on the API itself says how to fix the install.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  IBooking,
  IBookingCheck,
  IBookingRequest,
  ICancelAnswer,
  IContinueAnswer,
  IContinueRequest,
  IEmptyRequest,
  IOrphansRequest,
  IPortableState,
  IReservationsAnswer,
  IRoutesAnswer,
  ISettingsBody,
  ISnapshotAnswer,
  ISnapshotRequest,
  IStopAnswer,
  IWorkspaceSettings
} from './types';

export const API_ROOT = 'portable/api';

const NOT_INSTALLED_HINT =
  'The jupyter_portable server extension is not running: `pip install jupyter-portable`, ' +
  'check `jupyter server extension list`, then restart JupyterLab.';

/** An answer other than 2xx, or no answer at all. */
export class PortableApiError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
    readonly hint: string | null = null,
    readonly endpoint = ''
  ) {
    super(message);
    this.name = 'PortableApiError';
  }

  /** The message with its "to fix" hint, as a notification shows it. */
  get full(): string {
    return this.hint ? `${this.message} (${this.hint})` : this.message;
  }
}

/** Turn a body that failed into the error the server sent, or a plain one. */
export async function errorFrom(
  response: Response,
  endpoint: string
): Promise<PortableApiError> {
  let body: { error?: unknown; hint?: unknown; message?: unknown } = {};
  try {
    body = await response.json();
  } catch {
    // not JSON: the status says enough
  }
  const error =
    typeof body.error === 'string'
      ? body.error
      : typeof body.message === 'string'
        ? body.message
        : `${response.status} ${response.statusText || 'error'}`;
  const hint = typeof body.hint === 'string' ? body.hint : null;
  if (response.status === 404 && !hint && !/reservation/.test(endpoint)) {
    return new PortableApiError(
      `${endpoint}: not found`,
      404,
      NOT_INSTALLED_HINT,
      endpoint
    );
  }
  return new PortableApiError(error, response.status, hint, endpoint);
}

/** Call ``/portable/api/<endpoint>`` and read its JSON answer. */
export async function requestAPI<T>(
  endpoint: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_ROOT, endpoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new PortableApiError(
      `cannot reach the Jupyter server: ${(error as Error).message ?? error}`,
      null,
      'check that JupyterLab is still running',
      endpoint
    );
  }
  if (!response.ok) {
    throw await errorFrom(response, endpoint);
  }
  const body = await response.text();
  return (body ? JSON.parse(body) : {}) as T;
}

function post(body: unknown): RequestInit {
  return { method: 'POST', body: JSON.stringify(body ?? {}) };
}

/** The REST API of docs/api.md, one function per call. */
export class PortableClient {
  constructor(
    private readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  private call<T>(endpoint: string, init?: RequestInit): Promise<T> {
    return requestAPI<T>(endpoint, init, this.settings);
  }

  state(): Promise<IPortableState> {
    return this.call('state');
  }

  routes(hours: number): Promise<IRoutesAnswer> {
    return this.call(`routes?hours=${encodeURIComponent(String(hours))}`);
  }

  continue(route: string | null): Promise<IContinueAnswer> {
    return this.call('continue', post({ route } satisfies IContinueRequest));
  }

  cancel(): Promise<ICancelAnswer> {
    return this.call('cancel', post({} satisfies IEmptyRequest));
  }

  stop(): Promise<IStopAnswer> {
    return this.call('stop', post({} satisfies IEmptyRequest));
  }

  /** Keep the machine running: the idle countdown starts again. */
  keepRunning(): Promise<unknown> {
    return this.call('keep-running', post({} satisfies IEmptyRequest));
  }

  /** Terminate one machine the orphan sweep listed, named as provider/ref. */
  terminateOrphan(target: string): Promise<unknown> {
    return this.call('orphans', post({ terminate: target } satisfies IOrphansRequest));
  }

  snapshot(message: string): Promise<ISnapshotAnswer> {
    return this.call('snapshot', post({ message } satisfies ISnapshotRequest));
  }

  workspaceSettings(): Promise<IWorkspaceSettings> {
    return this.call('settings');
  }

  putWorkspaceSettings(body: ISettingsBody): Promise<IWorkspaceSettings> {
    return this.call('settings', { method: 'PUT', body: JSON.stringify(body) });
  }

  reservations(days: number): Promise<IReservationsAnswer> {
    return this.call(`reservations?days=${encodeURIComponent(String(days))}`);
  }

  book(request: IBookingRequest): Promise<IBooking> {
    return this.call('reservations', post(request));
  }

  /** What booking ``request`` would answer now, with nothing booked (a dry run). */
  checkBooking(request: IBookingRequest): Promise<IBookingCheck> {
    return this.call('reservations/check', post(request));
  }

  cancelBooking(id: string): Promise<IBooking> {
    return this.call(`reservations/${encodeURIComponent(id)}`, {
      method: 'DELETE'
    });
  }
}
