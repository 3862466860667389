/**
 * The sidebar's settings that belong to the workspace (driver, budget cap, planned hours,
 * auto-snapshot) and the server's `/portable/api/settings`: which of them changed, and the
 * PUT body that applies them. Plain functions: no JupyterLab, no network.
 *
 * The server's settings are the workspace's, kept in its store: they are the ones in effect.
 * On load, and whenever they change in the store (a terminal's `jupyter portable settings`),
 * the sidebar shows them and writes them into the registry (``mirrored``), so the Settings
 * Editor shows the workspace's values; nothing is sent on load. From then on, every field the
 * user changes in the Settings Editor is sent.
 */

import { DEFAULT_SETTINGS, IPortableSettings } from './settings';
import { DEFAULT_IDLE_MINUTES, ISettingsBody, IWorkspaceSettings } from './types';

/** The registry fields kept with the workspace. */
export const WORKSPACE_KEYS = [
  'pinnedDriver',
  'budgetCap',
  'plannedHours',
  'autoSnapshotMinutes',
  'maxPricePerHour',
  'gpuModels',
  'regions',
  'idleMinutes'
] as const;

export type WorkspaceKey = (typeof WORKSPACE_KEYS)[number];

export type IWorkspaceFields = Pick<IPortableSettings, WorkspaceKey>;

/** The workspace's settings in the registry's terms (null/absent -> the registry's "unset"). */
export function fromWorkspace(answer: IWorkspaceSettings): IWorkspaceFields {
  const auto = answer.autosnapshot_minutes;
  const total = answer.budget?.total;
  const cap = answer.budget?.max_price_per_hour;
  const idle = answer.idle_minutes;
  return {
    pinnedDriver: answer.requirements?.driver ?? '',
    budgetCap: typeof total === 'number' ? total : null,
    plannedHours: typeof answer.hours === 'number' && answer.hours > 0 ? answer.hours : DEFAULT_SETTINGS.plannedHours,
    autoSnapshotMinutes: typeof auto === 'number' ? auto : null,
    maxPricePerHour: typeof cap === 'number' ? cap : null,
    gpuModels: Array.isArray(answer.requirements?.gpus) ? [...answer.requirements.gpus] : [],
    regions: Array.isArray(answer.requirements?.regions) ? [...answer.requirements.regions] : [],
    // the server answers its default when none is set: only a value of the user's differs from it
    idleMinutes: typeof idle === 'number' && idle !== DEFAULT_IDLE_MINUTES ? idle : null
  };
}

/** The fields whose values differ between ``a`` and ``b``, in WORKSPACE_KEYS order. */
export function changedKeys(a: IWorkspaceFields, b: IWorkspaceFields): WorkspaceKey[] {
  return WORKSPACE_KEYS.filter(key => !same(a[key], b[key]));
}

// The server's idle stop when none is set: generated from settings.json (core/idle.py's).
export { DEFAULT_IDLE_MINUTES };

function same(a: unknown, b: unknown): boolean {
  return Array.isArray(a) || Array.isArray(b) ? JSON.stringify(a) === JSON.stringify(b) : a === b;
}

/** The PUT body setting ``keys`` to their values in ``fields``; an unset value clears. */
export function toBody(fields: IWorkspaceFields, keys: readonly WorkspaceKey[]): ISettingsBody {
  const body: ISettingsBody = {};
  for (const key of keys) {
    switch (key) {
      case 'pinnedDriver':
        body.driver = fields.pinnedDriver;
        break;
      case 'budgetCap':
        body.budget_total = fields.budgetCap ?? '';
        break;
      case 'plannedHours':
        body.hours = fields.plannedHours;
        break;
      case 'autoSnapshotMinutes':
        body.autosnapshot_minutes = fields.autoSnapshotMinutes ?? '';
        break;
      case 'maxPricePerHour':
        body.budget_max_price_per_hour = fields.maxPricePerHour ?? '';
        break;
      case 'gpuModels':
        body.gpus = fields.gpuModels.length ? [...fields.gpuModels] : '';
        break;
      case 'regions':
        body.regions = fields.regions.length ? [...fields.regions] : '';
        break;
      case 'idleMinutes':
        body.idle_minutes = fields.idleMinutes ?? '';
        break;
    }
  }
  return body;
}

/**
 * The user's settings (the registry's ``user`` object) with the workspace's ``fields`` written
 * in: a field at its schema default is left out (the Settings Editor shows the default), any
 * other is set; keys that are not the workspace's (the store URL) are kept as they are.
 */
export function mirrored(
  user: { readonly [key: string]: unknown },
  fields: IWorkspaceFields
): { [key: string]: unknown } {
  const out: { [key: string]: unknown } = { ...user };
  for (const key of WORKSPACE_KEYS) {
    if (same(fields[key], DEFAULT_SETTINGS[key])) {
      delete out[key];
    } else {
      out[key] = Array.isArray(fields[key]) ? [...(fields[key] as string[])] : fields[key];
    }
  }
  return out;
}

/** The registry's workspace fields out of all its settings. */
export function workspaceFields(settings: IPortableSettings): IWorkspaceFields {
  return {
    pinnedDriver: settings.pinnedDriver,
    budgetCap: settings.budgetCap,
    plannedHours: settings.plannedHours,
    autoSnapshotMinutes: settings.autoSnapshotMinutes,
    maxPricePerHour: settings.maxPricePerHour,
    gpuModels: settings.gpuModels,
    regions: settings.regions,
    idleMinutes: settings.idleMinutes
  };
}
