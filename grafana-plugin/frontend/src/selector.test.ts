import { addMatcher, escapeLabelValue, parseMatchers } from './selector';

describe('selector helpers', () => {
  it('parses empty and simple selectors', () => {
    expect(parseMatchers('{}')).toEqual([]);
    expect(parseMatchers('')).toEqual([]);
    expect(parseMatchers('{a="b", c!~"d.*"}')).toEqual([
      { name: 'a', op: '=', value: 'b' },
      { name: 'c', op: '!~', value: 'd.*' },
    ]);
    expect(parseMatchers('{a="x\\"y"}')).toEqual([{ name: 'a', op: '=', value: 'x\\"y' }]);
  });

  it('rejects what it cannot parse', () => {
    expect(parseMatchers('{a=b}')).toBeUndefined();
    expect(parseMatchers('a="b"')).toBeUndefined();
  });

  it('adds a matcher to an empty selector', () => {
    expect(addMatcher('{}', 'service_name', 'api')).toBe('{service_name="api"}');
    expect(addMatcher('', 'service_name', 'api')).toBe('{service_name="api"}');
  });

  it('appends to existing matchers and replaces an equality matcher on the same label', () => {
    expect(addMatcher('{region="eu"}', 'service_name', 'api')).toBe('{region="eu", service_name="api"}');
    expect(addMatcher('{service_name="web", region="eu"}', 'service_name', 'api')).toBe(
      '{service_name="api", region="eu"}'
    );
    expect(addMatcher('{service_name!="web"}', 'service_name', 'api')).toBe(
      '{service_name!="web", service_name="api"}'
    );
  });

  it('escapes quotes and backslashes in values', () => {
    expect(escapeLabelValue('a"b\\c')).toBe('a\\"b\\\\c');
    expect(addMatcher('{}', 'path', 'C:\\x "y"')).toBe('{path="C:\\\\x \\"y\\""}');
  });

  it('appends before the closing brace of an unparsable selector', () => {
    expect(addMatcher('{a=~$var}', 'b', 'c')).toBe('{a=~$var, b="c"}');
  });
});
