/** Reading the user's settings (schema/plugin.json) into a typed, validated object. */

import { DEFAULT_SETTINGS, IPortableSettings } from './types';

function num(value: unknown, fallback: number, min: number): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= min ? value : fallback;
}

/** The settings from the registry's composite; anything malformed falls back to its default. */
export function readSettings(composite: { [key: string]: unknown }): IPortableSettings {
  const cap = composite['budgetCap'];
  return {
    storeUrl: typeof composite['storeUrl'] === 'string' ? (composite['storeUrl'] as string) : DEFAULT_SETTINGS.storeUrl,
    budgetCap: typeof cap === 'number' && Number.isFinite(cap) && cap >= 0 ? cap : null,
    pinnedDriver:
      typeof composite['pinnedDriver'] === 'string' ? (composite['pinnedDriver'] as string) : DEFAULT_SETTINGS.pinnedDriver,
    autoSnapshotMinutes: num(composite['autoSnapshotMinutes'], DEFAULT_SETTINGS.autoSnapshotMinutes, 0),
    plannedHours: num(composite['plannedHours'], DEFAULT_SETTINGS.plannedHours, 0.1)
  };
}
