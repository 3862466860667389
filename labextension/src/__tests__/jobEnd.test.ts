import { describe, expect, it } from 'vitest';

import { jobEndText } from '../components/WorkspacePanel';

describe("the countdown to a Slurm job's walltime", () => {
  const end = '2026-12-06T14:00:00Z';
  const at = (iso: string) => Date.parse(iso);

  it('counts down on the page clock, and says the job queued to take over', () => {
    expect(jobEndText(end, null, at('2026-12-06T13:18:00Z'))).toMatch(/^in 42 min \(/);
    expect(jobEndText(end, null, at('2026-12-06T13:59:30Z'))).toMatch(/^in 30 s \(/);
    expect(jobEndText(end, '18', at('2026-12-06T13:18:00Z'))).toMatch(/; job 18 queued to take over$/);
  });

  it('says ended once the end has passed, and shows a time it cannot read as it came', () => {
    expect(jobEndText(end, null, at('2026-12-06T14:00:01Z'))).toBe('ended');
    expect(jobEndText(end, '18', at('2026-12-06T15:00:00Z'))).toBe('ended; job 18 queued to take over');
    expect(jobEndText('soon', null, 0)).toBe('soon');
  });
});
