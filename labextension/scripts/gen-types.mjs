/**
 * Generate src/types.ts from the JSON Schemas of the REST API
 * (jupyter_portable/interfaces/serverext/schemas/*.json): `jlpm gen:types`.
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
    ' * The shapes of the server extension\'s REST API (docs/api.md), as the sidebar reads them.',
    ' *',
    ` * GENERATED from the JSON Schemas in ${dir}/:`,
    ...files.map(name => ` *   ${name}`),
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
    required: files,
    properties: Object.fromEntries(files.map(name => [name, { $ref: name }]))
  };
  const out = await compile(wrapper, WRAPPER, {
    cwd: SCHEMA_DIR,
    bannerComment: banner(files),
    style: { singleQuote: true, printWidth: 100, bracketSpacing: true, trailingComma: 'none' }
  });
  const declaration = new RegExp(`\\nexport interface ${WRAPPER} \\{\\n[^}]*\\}\\n`);
  if (!declaration.test(out)) {
    throw new Error(`gen-types: the ${WRAPPER} declaration was not found in the output`);
  }
  const text = out.replace(declaration, '');
  const names = [...text.matchAll(/^export (?:interface|type) (\w+)/gm)].map(m => m[1]);
  const renamed = names.filter(name => /\d$/.test(name));
  if (renamed.length) {
    // json-schema-to-typescript numbers a second shape with the same title: a schema
    // defines a shape twice where it should `$ref` the first.
    throw new Error(`gen-types: duplicate titles in the schemas: ${renamed.join(', ')}`);
  }
  return text;
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
