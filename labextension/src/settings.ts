/** Reading the user's settings (schema/plugin.json) into a typed, validated object. */

/** The user's settings (schema/plugin.json). */
export interface IPortableSettings {
  storeUrl: string;
  budgetCap: number | null;
  pinnedDriver: string;
  /** 0: off; null: the machine's default. */
  autoSnapshotMinutes: number | null;
  plannedHours: number;
}

export const DEFAULT_SETTINGS: IPortableSettings = {
  storeUrl: '',
  budgetCap: null,
  pinnedDriver: '',
  autoSnapshotMinutes: null,
  plannedHours: 8
};

function num(value: unknown, fallback: number, min: number): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= min ? value : fallback;
}

function optionalNum(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}

/** The settings from the registry's composite; anything malformed falls back to its default. */
export function readSettings(composite: { [key: string]: unknown }): IPortableSettings {
  return {
    storeUrl: typeof composite['storeUrl'] === 'string' ? (composite['storeUrl'] as string) : DEFAULT_SETTINGS.storeUrl,
    budgetCap: optionalNum(composite['budgetCap']),
    pinnedDriver:
      typeof composite['pinnedDriver'] === 'string' ? (composite['pinnedDriver'] as string).trim() : DEFAULT_SETTINGS.pinnedDriver,
    autoSnapshotMinutes: optionalNum(composite['autoSnapshotMinutes']),
    plannedHours: num(composite['plannedHours'], DEFAULT_SETTINGS.plannedHours, 0.1)
  };
}
