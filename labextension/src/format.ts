/** Numbers as the sidebar shows them: money, durations, ages and sizes. Pure functions. */

export function money(dollars: number | null | undefined): string {
  if (dollars === null || dollars === undefined || !Number.isFinite(dollars)) {
    return '—';
  }
  if (dollars !== 0 && Math.abs(dollars) < 0.01) {
    return dollars < 0 ? '-<$0.01' : '<$0.01';
  }
  const sign = dollars < 0 ? '-' : '';
  return `${sign}$${Math.abs(dollars).toFixed(2)}`;
}

export function pricePerHour(dollars: number | null | undefined): string {
  return dollars === null || dollars === undefined ? '—' : `${money(dollars)}/h`;
}

/** "42 s", "7 min", "2.5 h", "3 d": the routing core's rounding, so both say the same. */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '—';
  }
  const s = Math.max(0, seconds);
  if (s < 90) {
    return `${Math.round(s)} s`;
  }
  if (s < 5400) {
    return `${Math.round(s / 60)} min`;
  }
  if (s < 72 * 3600) {
    return `${(s / 3600).toFixed(1)} h`;
  }
  return `${Math.round(s / 86400)} d`;
}

/** "ready in 41 s (predicted 35 s)": what a Continue took to Ready and what its route had said;
 * null until it was measured. */
export function readyLine(
  estimate:
    | { predicted?: { time_to_ready_s?: number }; measured?: { time_to_ready_s?: number } | null }
    | null
    | undefined
): string | null {
  const took = estimate?.measured?.time_to_ready_s;
  if (took === undefined || took === null) {
    return null;
  }
  const said = estimate?.predicted?.time_to_ready_s;
  return said === undefined ? `ready in ${duration(took)}` : `ready in ${duration(took)} (predicted ${duration(said)})`;
}

/** "Snapshot version 7 published; 2 files not backed up (see snapshot --json)": the snapshot's result
 * in the sidebar, saying how many files it could not back up. */
export function snapshotLine(version: number, changed: boolean, skipped: number): string {
  const head = changed ? `Snapshot version ${version} published` : `Nothing changed since version ${version}`;
  if (!skipped) {
    return head;
  }
  return `${head}; ${skipped} file${skipped === 1 ? '' : 's'} not backed up (\`jupyter portable snapshot --json\` lists them with why)`;
}

/** One difference of the machine's environment, as the server words it: "ipython 9.18.1 -> 8.39.0 (requires-python)". */
export function envChangeLine(c: {
  name: string;
  recorded: string | null;
  installed: string | null;
  why: string;
  kind: string;
  detail: string;
}): string {
  switch (c.kind) {
    case 'left-out':
      return `${c.name}${c.recorded ? ` ${c.recorded}` : ''}: left out (${c.why})`;
    case 'kept':
      return `${c.name} ${c.recorded} -> the image's ${c.installed} (${c.why})`;
    case 'added':
      return `${c.name} ${c.installed}: added (a dependency this Python needs)`;
    case 'built':
      return `${c.name} ${c.installed}: built on your side from ${c.detail}`;
    default:
      return `${c.name} ${c.recorded} -> ${c.installed} (${c.why})`;
  }
}

/** "Environment: Python 3.11.7 -> 3.10.13; 2 differences ...": what the Ready message adds when the
 * machine's environment is not exactly the recorded one; null when it is (or nothing is known). */
export function environmentLine(
  env: { exact: boolean; summary: string; mode: string } | null | undefined
): string | null {
  if (!env || env.exact) {
    return null;
  }
  return `Environment: ${env.summary}`;
}

/** How long ago ``iso`` was, relative to ``now`` (ms since the epoch). */
export function age(iso: string | null | undefined, now: number): string {
  if (!iso) {
    return '—';
  }
  const then = Date.parse(iso);
  if (Number.isNaN(then)) {
    return '—';
  }
  const s = (now - then) / 1000;
  if (s < 5) {
    return 'just now';
  }
  return `${duration(s)} ago`;
}

const UNITS = ['B', 'KB', 'MB', 'GB', 'TB'];

/** Decimal units, as the store format and the route costs count GB. */
export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return '—';
  }
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < UNITS.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${UNITS[unit]}`;
}

/** A time as "Mon 1 Dec 14:00" in the user's zone (for bookings and charges). */
export function when(iso: string | null | undefined): string {
  if (!iso) {
    return '—';
  }
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) {
    return iso;
  }
  return d.toLocaleString(undefined, {
    weekday: 'short',
    day: 'numeric',
    month: 'short',
    hour: '2-digit',
    minute: '2-digit'
  });
}

/** The user's time zone as a short name ("UTC", "CET", "GMT+2"). */
export function zone(iso?: string | null): string {
  const d = iso ? new Date(iso) : new Date();
  const part = new Intl.DateTimeFormat(undefined, { timeZoneName: 'short' })
    .formatToParts(Number.isNaN(d.getTime()) ? new Date() : d)
    .find(p => p.type === 'timeZoneName');
  return part?.value ?? 'local time';
}

/** "Mon 1 Dec 14:00–17:00 CET" (the end's day too when it is another day). */
export function span(startIso: string, hours: number): string {
  const start = new Date(startIso);
  if (Number.isNaN(start.getTime())) {
    return startIso;
  }
  const end = new Date(start.getTime() + hours * 3600_000);
  const sameDay = start.toDateString() === end.toDateString();
  const endText = sameDay
    ? end.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit' })
    : when(end.toISOString());
  return `${when(startIso)}–${endText} ${zone(startIso)}`;
}

/** A long path shortened to its last parts ("…/runs/7/ckpt.pt"); the full one goes in a title. */
export function shortPath(path: string, max = 32): string {
  if (path.length <= max) {
    return path;
  }
  const parts = path.split('/');
  let out = parts[parts.length - 1];
  for (let i = parts.length - 2; i >= 0 && out.length + parts[i].length + 1 <= max - 2; i--) {
    out = `${parts[i]}/${out}`;
  }
  return `…/${out}`;
}

/** The question before the first machine: "Rent NVIDIA L4 on local (local-a) at $0.40/h?" */
export function firstMachineQuestion(route: {
  gpu: string;
  gpu_count: number;
  provider: string;
  offer: string;
  region: string | null;
  price_per_hour: number;
}, state: string | null = 'IDLE'): string {
  const gpu = route.gpu_count > 1 ? `${route.gpu_count}x ${route.gpu}` : route.gpu;
  // after a release (an idle stop) the same question, saying why there is no machine
  const why = !state || state === 'IDLE' ? 'no GPU machine yet' : `no GPU machine: its last one was ${state}`;
  return (
    `Rent ${gpu} on ${route.provider} (${route.region ?? 'any region'}) at $${route.price_per_hour.toFixed(2)}/h? ` +
    `This notebook has ${why} (route ${route.provider}/${route.offer}).`
  );
}
