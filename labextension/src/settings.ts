/** Reading the user's settings (schema/plugin.json) into a typed, validated object. */

/** The user's settings (schema/plugin.json). */
export interface IPortableSettings {
  storeUrl: string;
  budgetCap: number | null;
  pinnedDriver: string;
  /** 0: off; null: the machine's default. */
  autoSnapshotMinutes: number | null;
  plannedHours: number;
  /** $/h; null: no cap. */
  maxPricePerHour: number | null;
  gpuModels: string[];
  regions: string[];
  /** 0: never; null: the default. */
  idleMinutes: number | null;
}

export const DEFAULT_SETTINGS: IPortableSettings = {
  storeUrl: '',
  budgetCap: null,
  pinnedDriver: '',
  autoSnapshotMinutes: null,
  plannedHours: 8,
  maxPricePerHour: null,
  gpuModels: [],
  regions: [],
  idleMinutes: null
};

function num(value: unknown, fallback: number, min: number): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= min ? value : fallback;
}

function optionalNum(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}

function names(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((x): x is string => typeof x === 'string' && x.trim() !== '').map(x => x.trim()) : [];
}

/** The settings from the registry's composite; anything malformed falls back to its default. */
export function readSettings(composite: { [key: string]: unknown }): IPortableSettings {
  return {
    storeUrl: typeof composite['storeUrl'] === 'string' ? (composite['storeUrl'] as string) : DEFAULT_SETTINGS.storeUrl,
    budgetCap: optionalNum(composite['budgetCap']),
    pinnedDriver:
      typeof composite['pinnedDriver'] === 'string' ? (composite['pinnedDriver'] as string).trim() : DEFAULT_SETTINGS.pinnedDriver,
    autoSnapshotMinutes: optionalNum(composite['autoSnapshotMinutes']),
    plannedHours: num(composite['plannedHours'], DEFAULT_SETTINGS.plannedHours, 0.01),
    maxPricePerHour: optionalNum(composite['maxPricePerHour']),
    gpuModels: names(composite['gpuModels']),
    regions: names(composite['regions']),
    idleMinutes: optionalNum(composite['idleMinutes'])
  };
}
