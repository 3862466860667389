import { describe, expect, it } from 'vitest';

import { PortableApiError, PortableClient } from '../api';
import { PortableModel } from '../model';
import { DEFAULT_SETTINGS, IPortableSettings } from '../settings';
import { ISettingsBody, IWorkspaceSettings } from '../types';
import { CHANGED_SCHEMA } from '../events';
import { IWorkspaceFields } from '../workspaceSettings';
import { settingsAnswer } from './fixtures';

/** A server holding one workspace's settings; it refuses what `refuse` says. */
class FakeServer {
  settings: IWorkspaceSettings = settingsAnswer({
    requirements: { driver: '535.1' },
    budget: { total: 40 },
    hours: 3
  });
  puts: ISettingsBody[] = [];
  routeFetches: number[] = [];
  refuse: string | null = null;

  client(): PortableClient {
    return {
      workspaceSettings: async () => this.settings,
      putWorkspaceSettings: async (body: ISettingsBody) => {
        this.puts.push(body);
        if (this.refuse) {
          throw new PortableApiError(this.refuse, 400, 'see docs/api.md', 'settings');
        }
        const s = structuredClone(this.settings);
        const clear = <T>(v: T | '') => (v === '' ? null : v);
        if (body.driver !== undefined) s.requirements.driver = clear(body.driver);
        if (body.budget_total !== undefined) s.budget.total = clear(body.budget_total);
        if (typeof body.hours === 'number') s.hours = body.hours;
        if (body.autosnapshot_minutes !== undefined) s.autosnapshot_minutes = clear(body.autosnapshot_minutes);
        this.settings = s;
        return s;
      },
      state: async () => {
        throw new PortableApiError('no state here', 500);
      },
      routes: async (hours: number) => {
        this.routeFetches.push(hours);
        return { routes: [], best: null, hours };
      },
      reservations: async () => ({ reservations: [], calendar: null, skipped: [] })
    } as unknown as PortableClient;
  }
}

/** The server's event stream, as the model listens to it. */
class FakeEvents {
  slots: [(sender: unknown, emission: { schema_id: string; [key: string]: unknown }) => void, unknown][] = [];
  connect(slot: FakeEvents['slots'][number][0], thisArg?: unknown): boolean {
    this.slots.push([slot, thisArg]);
    return true;
  }
  disconnect(): boolean {
    return true;
  }
  emit(emission: { schema_id: string; [key: string]: unknown }): void {
    this.slots.forEach(([slot, thisArg]) => slot.call(thisArg, this, emission));
  }
}

function setup() {
  const server = new FakeServer();
  const errors: string[] = [];
  const mirrored: IWorkspaceFields[] = [];
  const events = new FakeEvents();
  const model = new PortableModel(
    server.client(),
    events,
    { notice: () => undefined, error: m => errors.push(m) },
    async fields => {
      mirrored.push(fields);
    }
  );
  return { server, errors, model, mirrored, events };
}

const registry = (changes: Partial<IPortableSettings> = {}): IPortableSettings => ({ ...DEFAULT_SETTINGS, ...changes });
/** The registry once the workspace's values were written into it, with the user's ``changes``. */
const loaded = (changes: Partial<IPortableSettings> = {}): IPortableSettings =>
  registry({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3, ...changes });

describe('the settings apply to the workspace', () => {
  it('on load, registry defaults show the workspace values and send nothing', async () => {
    const { server, model } = setup();
    await model.applySettings(registry());
    expect(server.puts).toEqual([]);
    expect(model.settings).toMatchObject({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 });
    expect(model.hours).toBe(3);
  });

  it("on load, the workspace's values win and are written into the Settings Editor, nothing is sent", async () => {
    const { server, model, mirrored } = setup();
    await model.applySettings(registry({ pinnedDriver: '550.54.15' }));
    expect(server.puts).toEqual([]);
    expect(model.settings).toMatchObject({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 });
    expect(mirrored).toEqual([expect.objectContaining({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 })]);
    // the registry's change that the mirror makes is no change of the user's: nothing goes back
    await model.applySettings(registry({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 }));
    expect(server.puts).toEqual([]);
  });

  it('a change made in a terminal reaches the sidebar and the Settings Editor by its event', async () => {
    const { server, model, mirrored, events } = setup();
    await model.applySettings(registry({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 }));
    expect(mirrored).toEqual([]); // the registry already holds the workspace's values
    // `jupyter portable settings --budget 10` elsewhere: the server sees the store change and says so
    server.settings = settingsAnswer({ requirements: { driver: '535.1' }, budget: { total: 10 }, hours: 3 });
    events.emit({ schema_id: CHANGED_SCHEMA, workspace_id: 'w', what: 'settings' });
    await model.workspaceSettingsChanged();
    expect(model.settings.budgetCap).toBe(10);
    expect(mirrored).toEqual([expect.objectContaining({ budgetCap: 10 })]);
    expect(server.puts).toEqual([]);
  });

  it('each settings change is counted, even one that leaves the state as it read: a dry run is asked again', async () => {
    const { server, model } = setup();
    await model.applySettings(registry({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 }));
    const before = model.settingsSeen;
    // a budget set and cleared elsewhere before this sidebar read the state: it reads the same after both
    await model.workspaceSettingsChanged();
    await model.workspaceSettingsChanged();
    expect(model.settings.budgetCap).toBe(40);
    expect(model.settingsSeen).toBe(before + 2);
    expect(server.puts).toEqual([]);
  });

  it('a change sends that field alone; clearing it sends ""', async () => {
    const { server, model } = setup();
    await model.applySettings(registry());
    // the Settings Editor now holds the workspace's values (mirrored); the user edits from there
    await model.applySettings(loaded({ budgetCap: 12 }));
    await model.applySettings(loaded({ budgetCap: null }));
    expect(server.puts).toEqual([{ budget_total: 12 }, { budget_total: '' }]);
    expect(model.settings.budgetCap).toBeNull();
  });

  it("a refused change is a notification with the server's message, and the workspace's value stays shown", async () => {
    const { server, errors, model } = setup();
    await model.applySettings(registry());
    server.refuse = 'hours must be a non-negative number';
    await model.applySettings(loaded({ plannedHours: 5 }));
    expect(errors).toEqual(['Workspace settings not applied: hours must be a non-negative number (see docs/api.md)']);
    expect(model.status.settings?.kind).toBe('error');
    expect(model.settings.plannedHours).toBe(3);
  });
});
