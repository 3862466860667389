import { describe, expect, it } from 'vitest';

import { budgetLeftText } from '../components/WorkspacePanel';
import { budgetDecidesRoutes } from '../model';

describe("the sidebar's budget line says the server's left", () => {
  it('cap - spent - committed, with what bookings hold back (issue 30, item 2)', () => {
    // a $10 budget, $0.07 spent, a $7.16 booking: the figure `jupyter portable spend` says too
    expect(budgetLeftText({ state: 'ok', cap: 10, spent: 0.07, committed: 7.16, left: 2.77 })).toBe(
      'budget $10.00, $2.77 left ($7.16 committed to bookings)'
    );
  });

  it('the server\'s left is shown as it is, and nothing about bookings when none holds money', () => {
    expect(budgetLeftText({ state: 'ok', cap: 10, spent: 0.07, committed: 0, left: 9.93 })).toBe(
      'budget $10.00, $9.93 left'
    );
  });

  it('an older server without left or committed: worked out the same way', () => {
    expect(budgetLeftText({ state: 'ok', cap: 10, spent: 3 })).toBe('budget $10.00, $7.00 left');
    expect(budgetLeftText({ state: 'ok', cap: null, spent: 3 })).toBe('');
  });
});

describe('while a machine runs, the routes tick where the budget decides them (issue 43, item 4)', () => {
  it('a refusal that quotes what is left is read again at each cent; others are not', () => {
    const blocked = (text: string | null) => ({ routes: [{ blocked: null }, { blocked: text }] });
    expect(budgetDecidesRoutes(blocked('$20.00 total for 8 h is over the $18.00 left of the budget'))).toBe(true);
    expect(budgetDecidesRoutes(blocked('$4.80/h is over the cap of $1.00/h'))).toBe(false);
    expect(budgetDecidesRoutes(blocked(null))).toBe(false);
    expect(budgetDecidesRoutes(null)).toBe(false);
  });
});
