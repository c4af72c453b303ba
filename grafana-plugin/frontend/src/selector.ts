/**
 * Helpers for PromQL-style label selectors such as `{service_name="api", region!="eu"}`.
 */

/** Escapes a label value for use inside double quotes. */
export function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

const MATCHER_RE = /\s*([a-zA-Z_][a-zA-Z0-9_.]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*/y;

/** Splits the inside of a selector into its matchers; returns undefined when it cannot be parsed. */
export function parseMatchers(selector: string): Array<{ name: string; op: string; value: string }> | undefined {
  const trimmed = selector.trim();
  let inner = trimmed;
  if (inner === '') {
    return [];
  }
  if (!inner.startsWith('{') || !inner.endsWith('}')) {
    return undefined;
  }
  inner = inner.slice(1, -1);
  const out: Array<{ name: string; op: string; value: string }> = [];
  let pos = 0;
  while (pos < inner.length) {
    if (inner.slice(pos).trim() === '') {
      break;
    }
    MATCHER_RE.lastIndex = pos;
    const m = MATCHER_RE.exec(inner);
    if (!m) {
      return undefined;
    }
    out.push({ name: m[1], op: m[2], value: m[3] });
    pos = MATCHER_RE.lastIndex;
    if (pos < inner.length) {
      if (inner[pos] !== ',') {
        return undefined;
      }
      pos += 1;
    }
  }
  return out;
}

/**
 * Returns `selector` with the matcher `name="value"` added. An existing `name="…"` equality
 * matcher is replaced. A selector that cannot be parsed gets the matcher appended before its `}`.
 */
export function addMatcher(selector: string, name: string, value: string): string {
  const matcher = `${name}="${escapeLabelValue(value)}"`;
  const parsed = parseMatchers(selector);
  if (parsed === undefined) {
    const s = selector.trim();
    const close = s.lastIndexOf('}');
    if (close < 0) {
      return `{${matcher}}`;
    }
    const before = s.slice(0, close).trim();
    const sep = before.endsWith('{') || before.endsWith(',') ? '' : ', ';
    return `${before}${sep}${matcher}}`;
  }
  const parts: string[] = [];
  let replaced = false;
  for (const m of parsed) {
    if (m.name === name && m.op === '=') {
      if (!replaced) {
        parts.push(matcher);
        replaced = true;
      }
      continue;
    }
    parts.push(`${m.name}${m.op}"${m.value}"`);
  }
  if (!replaced) {
    parts.push(matcher);
  }
  return `{${parts.join(', ')}}`;
}
