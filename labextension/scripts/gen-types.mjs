/**
 * Generate src/types.ts from the JSON Schemas of the REST API
 * (jupyter_portable/interfaces/serverext/schemas/*.json) and of the events the server emits
 * (../events/*.yaml, as jupyter_events registers them): `jlpm gen:types`.
 *
 * Every schema is compiled in one pass, so a shape that several schemas share (by `$ref`)
 * is declared once, under its `title`. The output depends only on the schemas and the
 * locked json-schema-to-typescript: no paths, no dates.
 */

import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

import { compile } from 'json-schema-to-typescript';

const here = dirname(fileURLToPath(import.meta.url));
const ROOT = join(here, '..', '..');
export const SCHEMA_DIR = join(ROOT, 'jupyter_portable', 'interfaces', 'serverext', 'schemas');
export const EVENTS_DIR = join(ROOT, 'jupyter_portable', 'interfaces', 'serverext', 'events');
// Each event's payload, by its schema's file, under the name the sidebar reads it by.
const EVENTS = {
  'changed.yaml': 'IChangedEvent',
  'notice.yaml': 'INoticeEvent',
  'progress.yaml': 'IProgressEvent'
};
export const TYPES_FILE = join(here, '..', 'src', 'types.ts');

// A wrapper holding every schema; its own declaration is dropped from the output.
const WRAPPER = 'GeneratedFromSchemas';

function posix(path) {
  return path.split('\\').join('/');
}

/** The schema files, in a fixed order. */
export function schemaFiles() {
  return readdirSync(SCHEMA_DIR)
    .filter(name => name.endsWith('.json'))
    .sort();
}

function banner(files) {
  const dir = posix(relative(ROOT, SCHEMA_DIR));
  return [
    '/**',
    ' * The shapes of the server extension\'s REST API and events (docs/api.md), as the sidebar',
    ' * reads them.',
    ' *',
    ` * GENERATED from the JSON Schemas in ${dir}/:`,
    ...files.map(name => ` *   ${name}`),
    ` * and the event schemas in ${posix(relative(ROOT, EVENTS_DIR))}/:`,
    ...Object.keys(EVENTS).map(name => ` *   ${name}`),
    ' * Do not edit: change a schema, then run `jlpm gen:types` in labextension/.',
    ' */'
  ].join('\n');
}

/** The text of src/types.ts, generated from the schemas. */
export async function generate() {
  const files = schemaFiles();
  const wrapper = {
    title: WRAPPER,
    type: 'object',
    additionalProperties: false,
    required: [...files, ...Object.keys(EVENTS)],
    properties: Object.fromEntries([
      ...files.map(name => [name, { $ref: name }]),
      ...Object.keys(EVENTS).map(name => [name, { $ref: posix(relative(SCHEMA_DIR, join(EVENTS_DIR, name))) }])
    ])
  };
  const eventNames = Object.fromEntries(
    Object.entries(EVENTS).map(([name, title]) => [eventId(name), title])
  );
  const out = await compile(wrapper, WRAPPER, {
    cwd: SCHEMA_DIR,
    bannerComment: banner(files),
    // an event schema's title is jupyter_events' words for people; its type is named by its $id
    customName: schema => eventNames[schema.$id],
    style: { singleQuote: true, printWidth: 100, bracketSpacing: true, trailingComma: 'none' }
  });
  const declaration = new RegExp(`\\nexport interface ${WRAPPER} \\{\\n[^}]*\\}\\n`);
  if (!declaration.test(out)) {
    throw new Error(`gen-types: the ${WRAPPER} declaration was not found in the output`);
  }
  const text = out.replace(declaration, '') + constants(files);
  const names = [...text.matchAll(/^export (?:interface|type) (\w+)/gm)].map(m => m[1]);
  const renamed = names.filter(name => /\d$/.test(name));
  if (renamed.length) {
    // json-schema-to-typescript numbers a second shape with the same title: a schema
    // defines a shape twice where it should `$ref` the first.
    throw new Error(`gen-types: duplicate titles in the schemas: ${renamed.join(', ')}`);
  }
  return text;
}

/**
 * The values the sidebar needs at run time, not only as types: each event schema's ``$id``
 * (``PROGRESS_SCHEMA``, ...), and every definition that names an ``x-constant``: the list of
 * its ``enum`` (``CONTINUE_FROM``, ...) or its ``const``: a number or a string (``CHARGE_LEAD_HOURS``),
 * or an object of them (``STATE_STEP``).
 */
function constants(files) {
  const quote = v => `'${String(v).replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`;
  const lines = ['', '// Values, GENERATED from the same schemas.'];
  const events = readdirSync(EVENTS_DIR)
    .filter(name => name.endsWith('.yaml'))
    .sort();
  for (const name of events) {
    const constant = `${name.replace(/\.yaml$/, '').toUpperCase()}_SCHEMA`;
    lines.push(`/** The $id of ${posix(relative(ROOT, join(EVENTS_DIR, name)))}. */`);
    lines.push(`export const ${constant} = ${quote(eventId(name))};`);
  }
  for (const name of files) {
    const schema = JSON.parse(readFileSync(join(SCHEMA_DIR, name), 'utf-8'));
    for (const def of Object.values(schema.definitions ?? {})) {
      const constant = def['x-constant'];
      if (!constant) {
        continue;
      }
      const value = v =>
        typeof v === 'number'
          ? String(v)
          : typeof v === 'object' && v !== null
            ? `{ ${Object.entries(v).map(([k, x]) => `${quote(k)}: ${value(x)}`).join(', ')} }`
            : quote(v);
      lines.push(`/** ${def.description ?? constant} */`);
      if (Array.isArray(def.enum)) {
        lines.push(`export const ${constant} = [${def.enum.map(value).join(', ')}] as const;`);
      } else if ('const' in def) {
        const asConst = typeof def.const === 'object' ? ' as const' : '';
        lines.push(`export const ${constant} = ${value(def.const)}${asConst};`);
      } else {
        throw new Error(`gen-types: ${name}: x-constant ${constant} names no enum or const`);
      }
    }
  }
  return lines.join('\n') + '\n';
}

/** The ``$id`` of the event schema ``name``, read from its first line (``"$id": https://...``). */
function eventId(name) {
  const text = readFileSync(join(EVENTS_DIR, name), 'utf-8');
  const id = /^"\$id": (\S+)$/m.exec(text);
  if (!id) {
    throw new Error(`gen-types: no "$id" line in ${name}`);
  }
  return id[1];
}

/** The generated text and the committed src/types.ts, for the test that they agree. */
export async function check() {
  const committed = readFileSync(TYPES_FILE, 'utf-8').replace(/\r\n/g, '\n');
  return { generated: await generate(), committed };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(TYPES_FILE, await generate());
  console.log(`wrote ${posix(relative(process.cwd(), TYPES_FILE))} from ${schemaFiles().length} schemas`);
}
