import { describe, expect, it } from 'vitest';

import { DEFAULT_SETTINGS, readSettings } from '../settings';
import { settingsAnswer } from './fixtures';
import {
  changedKeys,
  fromWorkspace,
  IWorkspaceFields,
  mirrored,
  toBody,
  workspaceFields
} from '../workspaceSettings';

const DEFAULTS: IWorkspaceFields = workspaceFields(DEFAULT_SETTINGS);

const answer = settingsAnswer;

describe("the workspace's settings in the registry's terms", () => {
  it('an unconfigured workspace reads as the schema defaults', () => {
    expect(fromWorkspace(answer())).toEqual(DEFAULTS);
  });

  it('set fields come through, 0 minutes (off) included', () => {
    const ws = answer({
      requirements: { driver: '535.1' },
      budget: { total: 40 },
      hours: 3,
      autosnapshot_minutes: 0
    });
    expect(fromWorkspace(ws)).toEqual({
      ...DEFAULTS,
      pinnedDriver: '535.1',
      budgetCap: 40,
      plannedHours: 3,
      autoSnapshotMinutes: 0
    });
  });
});

describe('the price cap, GPU models, regions and idle stop', () => {
  it('come from the workspace, the idle default reading as unset', () => {
    const ws = answer({
      requirements: { gpus: ['H100'], regions: ['us-east-1'] },
      budget: { max_price_per_hour: 3 },
      idle_minutes: 30
    });
    expect(fromWorkspace(ws)).toEqual({
      ...DEFAULTS,
      gpuModels: ['H100'],
      regions: ['us-east-1'],
      maxPricePerHour: 3,
      idleMinutes: null
    });
  });

  it('go to the API by their names, an empty list or unset clearing them', () => {
    const fields = { ...DEFAULTS, maxPricePerHour: 2.5, gpuModels: ['A100'], regions: [], idleMinutes: 45 };
    expect(toBody(fields, ['maxPricePerHour', 'gpuModels', 'regions', 'idleMinutes'])).toEqual({
      budget_max_price_per_hour: 2.5,
      gpus: ['A100'],
      regions: '',
      idle_minutes: 45
    });
    expect(changedKeys(DEFAULTS, { ...DEFAULTS, gpuModels: [] })).toEqual([]);
    expect(changedKeys(DEFAULTS, { ...DEFAULTS, gpuModels: ['L4'] })).toEqual(['gpuModels']);
  });
});

describe('which fields changed, and the PUT body for them', () => {
  it('only the changed fields are listed', () => {
    expect(changedKeys(DEFAULTS, DEFAULTS)).toEqual([]);
    expect(changedKeys(DEFAULTS, { ...DEFAULTS, pinnedDriver: '1.2.3', plannedHours: 2 })).toEqual([
      'pinnedDriver',
      'plannedHours'
    ]);
  });

  it('maps each field to its API name', () => {
    const fields = { ...DEFAULTS, pinnedDriver: '550.54.15', budgetCap: 25, plannedHours: 4, autoSnapshotMinutes: 15 };
    expect(toBody(fields, ['pinnedDriver', 'budgetCap', 'plannedHours', 'autoSnapshotMinutes'])).toEqual({
      driver: '550.54.15',
      budget_total: 25,
      hours: 4,
      autosnapshot_minutes: 15
    });
  });

  it('sends only the keys asked for', () => {
    expect(toBody({ ...DEFAULTS, pinnedDriver: 'x', budgetCap: 9 }, ['budgetCap'])).toEqual({ budget_total: 9 });
  });

  it('an emptied field is cleared on the server with ""', () => {
    expect(toBody(DEFAULTS, ['pinnedDriver', 'budgetCap', 'autoSnapshotMinutes'])).toEqual({
      driver: '',
      budget_total: '',
      autosnapshot_minutes: ''
    });
  });

  it('0 minutes turns auto-snapshot off rather than clearing it', () => {
    expect(toBody({ ...DEFAULTS, autoSnapshotMinutes: 0 }, ['autoSnapshotMinutes'])).toEqual({
      autosnapshot_minutes: 0
    });
  });
});

describe("the Settings Editor shows the workspace's values", () => {
  const configured = fromWorkspace(
    answer({ requirements: { driver: '535.1' }, budget: { total: 40 }, hours: 3, autosnapshot_minutes: 5 })
  );

  it("writes the workspace's fields into the user's settings, and keeps the store URL", () => {
    const user = { storeUrl: 's3://b/p', budgetCap: 12, pinnedDriver: '550.54.15' };
    expect(mirrored(user, configured)).toEqual({
      storeUrl: 's3://b/p',
      budgetCap: 40,
      pinnedDriver: '535.1',
      plannedHours: 3,
      autoSnapshotMinutes: 5
    });
  });

  it('a field at its default is left out, so the editor shows the default', () => {
    expect(mirrored({ budgetCap: 12, gpuModels: ['H100'] }, DEFAULTS)).toEqual({});
  });
});

describe('reading the registry', () => {
  it('empty and malformed values read as unset', () => {
    const s = readSettings({ budgetCap: null, autoSnapshotMinutes: 'often', pinnedDriver: ' 550.54.15 ' });
    expect(s.budgetCap).toBeNull();
    expect(s.autoSnapshotMinutes).toBeNull();
    expect(s.pinnedDriver).toBe('550.54.15');
    expect(readSettings({})).toEqual(DEFAULT_SETTINGS);
  });

  it('0 minutes is kept (off)', () => {
    expect(readSettings({ autoSnapshotMinutes: 0 }).autoSnapshotMinutes).toBe(0);
  });
});
