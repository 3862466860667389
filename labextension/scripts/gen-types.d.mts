/** The text of src/types.ts, generated from the REST API's JSON Schemas. */
export function generate(): Promise<string>;
/** The generated text and the committed src/types.ts. */
export function check(): Promise<{ generated: string; committed: string }>;
/** The schema file names, in the order they are compiled. */
export function schemaFiles(): string[];
export const SCHEMA_DIR: string;
export const TYPES_FILE: string;
