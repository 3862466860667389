import { describe, expect, it } from 'vitest';

import { PortableApiError, PortableClient } from '../api';
import { PortableModel } from '../model';
import { DEFAULT_SETTINGS, IPortableSettings } from '../settings';
import { ISettingsBody, IWorkspaceSettings } from '../types';
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
      }
    } as unknown as PortableClient;
  }
}

function setup() {
  const server = new FakeServer();
  const errors: string[] = [];
  const model = new PortableModel(server.client(), null, { notice: () => undefined, error: m => errors.push(m) });
  return { server, errors, model };
}

const registry = (changes: Partial<IPortableSettings> = {}): IPortableSettings => ({ ...DEFAULT_SETTINGS, ...changes });

describe('the settings apply to the workspace', () => {
  it('on load, registry defaults show the workspace values and send nothing', async () => {
    const { server, model } = setup();
    await model.applySettings(registry());
    expect(server.puts).toEqual([]);
    expect(model.settings).toMatchObject({ pinnedDriver: '535.1', budgetCap: 40, plannedHours: 3 });
    expect(model.hours).toBe(3);
  });

  it('on load, a value the user set is sent; then routes are priced again', async () => {
    const { server, model } = setup();
    await model.applySettings(registry({ pinnedDriver: '550.54.15' }));
    expect(server.puts).toEqual([{ driver: '550.54.15' }]);
    expect(model.settings.pinnedDriver).toBe('550.54.15');
    expect(server.routeFetches).toEqual([3]);
  });

  it('a change sends that field alone; clearing it sends ""', async () => {
    const { server, model } = setup();
    await model.applySettings(registry());
    await model.applySettings(registry({ budgetCap: 12 }));
    await model.applySettings(registry());
    expect(server.puts).toEqual([{ budget_total: 12 }, { budget_total: '' }]);
    expect(model.settings.budgetCap).toBeNull();
  });

  it("a refused change is a notification with the server's message, and the workspace's value stays shown", async () => {
    const { server, errors, model } = setup();
    await model.applySettings(registry());
    server.refuse = 'hours must be a non-negative number';
    await model.applySettings(registry({ plannedHours: 5 }));
    expect(errors).toEqual(['Workspace settings not applied: hours must be a non-negative number (see docs/api.md)']);
    expect(model.status.settings?.kind).toBe('error');
    expect(model.settings.plannedHours).toBe(3);
  });
});
