import { describe, expect, it } from 'vitest';

import * as fmt from '../format';
import { checksInWords, lossInWords, machineName, offerName, riskInWords, termWords } from '../routes';
import { IRoute } from '../types';
import { route } from './fixtures';
import routes50 from './routes50.json';

// The 50 routes of tests/test_route_words.py, ranked by the Python core with $41.37 of budget left.
const ROUTES = routes50 as unknown as IRoute[];

describe('the cap message and the Total column', () => {
  it('quote the same figure for every route of fifty', () => {
    const blocked = ROUTES.filter(r => r.reasons.budget);
    expect(blocked.length).toBeGreaterThan(10);
    for (const r of ROUTES) {
      if (r.reasons.budget) {
        expect(r.reasons.budget.startsWith(`${fmt.money(r.cost.total)} total for 7.5 h`)).toBe(true);
      }
    }
  });
});

describe('a route whose machine cannot stop itself', () => {
  it('says so before renting, with the cost of one idle night (issue 42)', () => {
    const lambda = ROUTES.filter(r => r.provider === 'lambda');
    expect(lambda.length).toBeGreaterThan(0);
    for (const r of lambda) {
      const night = fmt.money(r.price_per_hour * 12);
      expect(r.words?.unattended).toBe(
        `If this laptop sleeps, nothing can stop this machine: one idle night (12 h) costs about ${night}`
      );
    }
    expect(ROUTES.filter(r => r.provider === 'runpod').every(r => r.words?.unattended === undefined)).toBe(true);
  });
});

describe('routes in words', () => {
  it('names a machine GPU first, with the provider as its users call it', () => {
    expect(machineName({ gpu: 'NVIDIA A100 80GB', provider: 'runpod', region: 'EU-RO-1' })).toBe(
      'NVIDIA A100 80GB · RunPod · EU-RO-1'
    );
    expect(machineName({ gpu: null, provider: 'local', offer: 'l4', region: null })).toBe('l4 · Local market');
  });

  it('names an offer key from the routes, else shows the key', () => {
    const r = route({ id: 'r', provider: 'local', offer: 'a100', gpu: 'A100', region: 'local-a' });
    expect(offerName('local/a100', [r])).toBe('A100 · Local market · local-a');
    expect(offerName('aws/p5', [r])).toBe('aws/p5');
  });

  it('says which checks were done', () => {
    const r = route({ id: 'r' });
    expect(checksInWords({ ...r, checks: { listed: true, permitted: true, capacity: true, launched: null } })).toBe(
      'capacity checked, not launched'
    );
    expect(checksInWords({ ...r, checks: { listed: true, permitted: null, capacity: null, launched: null } })).toBe(
      'listed only: capacity not checked, not launched'
    );
  });

  it('gives risk as a chance, the hours and dollars it is expected to cost, with what happened', () => {
    const risk = { p_launch: 0, p_lost: 0.08, launch_s: 60, notice_s: 2, again_s: 60, work_s: 300, hours: 0.33, rate: 1.2,
      checkpoint_age_s: 240, checkpoint_every_s: 600 };
    const r = { ...route({ id: 'r' }), p_fail: 0.08, history: ['preempted 4 min ago'], risk };
    r.cost = { ...r.cost, risk: 0.4 };
    expect(riskInWords(r, fmt.money, 8)).toBe(
      '8% chance of a failed launch or a lost machine in the 8 planned h: 0.3 h lost, $0.40 expected (preempted 4 min ago)'
    );
    expect(lossInWords(r, fmt.duration)).toBe(
      'A lost machine costs 2 s to notice, 60 s to Continue again and 5 min of work since the last verified checkpoint,' +
        ' on average (the last is 4 min old, one every ~10 min)'
    );
    expect(lossInWords({ ...r, risk: { ...risk, checkpoint_age_s: null, checkpoint_every_s: null } }, fmt.duration)).toMatch(
      /on average \(no verified checkpoint yet\)$/
    );
  });

  it('says the same words as the Python core for every one of the fifty routes', () => {
    for (const r of ROUTES) {
      const words = r.words?.risk ?? '';
      expect(words.slice(0, `Risk: ${riskInWords(r, fmt.money, 7.5)}`.length)).toBe(`Risk: ${riskInWords(r, fmt.money, 7.5)}`);
      expect(words.endsWith(`. ${lossInWords(r, fmt.duration)}`)).toBe(true);
    }
  });

  it('defines every cost part, in the route’s own numbers when the server gave them', () => {
    expect(termWords('queue')).toMatch(/^Queue: /);
    const r = { ...route({ id: 'r' }), words: { queue: 'Queue: about 5 min of waiting' } };
    expect(termWords('queue', r)).toBe('Queue: about 5 min of waiting');
  });
});

describe('shortened paths', () => {
  it('keep the last parts and fit', () => {
    const long = '/home/researcher/projects/big-model/runs/2026-11-02/checkpoints/step-700/ckpt.pt';
    const short = fmt.shortPath(long);
    expect(short.length).toBeLessThanOrEqual(32);
    expect(short.startsWith('…/')).toBe(true);
    expect(short.endsWith('/step-700/ckpt.pt')).toBe(true);
    expect(fmt.shortPath('/a/b.txt')).toBe('/a/b.txt');
  });
});
