// `.lizardignore`: which paths of a pushed directory stay out of the push.
//
// A gitignore subset, the same rules `lizard push` applies: one pattern a line; blank lines
// and `#` comments are skipped; `!pattern` takes a path back in; a trailing `/` matches
// directories only; a pattern without a `/` elsewhere matches a name at any depth, one with
// a `/` is relative to the file's directory; `*` and `?` stay within one path segment, `**`
// spans segments, `[abc]` is a character class. The last pattern that matches decides, and
// a `.lizardignore` deeper in the tree overrides those above it.

/** The ignore file's name, read in every directory of the push. */
export const IGNORE_FILE = '.lizardignore'

const escapeRe = (c) => c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')

/** A glob as a regular expression source over `/`-separated paths. */
function globToRegex(glob) {
  let out = ''
  let i = 0
  while (i < glob.length) {
    const c = glob[i]
    if (glob.startsWith('**/', i)) {
      out += '(?:.*/)?'
      i += 3
    } else if (glob.startsWith('**', i)) {
      out += '.*'
      i += 2
    } else if (c === '*') {
      out += '[^/]*'
      i += 1
    } else if (c === '?') {
      out += '[^/]'
      i += 1
    } else if (c === '[' && glob.indexOf(']', i + 2) !== -1) {
      const end = glob.indexOf(']', i + 2)
      let body = glob.slice(i + 1, end)
      if (body.startsWith('!')) body = `^${body.slice(1)}`
      out += `[${body.replace(/\\/g, '\\\\')}]`
      i = end + 1
    } else if (c === '\\' && i + 1 < glob.length) {
      out += escapeRe(glob[i + 1])
      i += 2
    } else {
      out += escapeRe(c)
      i += 1
    }
  }
  return out
}

function parse(line) {
  line = line.replace(/\r$/, '')
  // Trailing spaces do not count unless escaped.
  let stripped = line.replace(/ +$/, '')
  if (stripped.endsWith('\\') && stripped.length < line.length) stripped += ' '
  line = stripped
  if (!line || line.startsWith('#')) return undefined
  const negated = line.startsWith('!')
  if (negated) line = line.slice(1)
  else if (line.startsWith('\\#') || line.startsWith('\\!')) line = line.slice(1)
  const dirOnly = line.endsWith('/')
  line = line.replace(/\/+$/, '')
  if (!line) return undefined
  const anchored = line.includes('/')
  line = line.replace(/^\/+/, '')
  return { regex: new RegExp(`^${globToRegex(line)}$`, 's'), negated, dirOnly, anchored }
}

/** The patterns of one `.lizardignore`; `base` is its directory, relative to the pushed directory ('' for the top). */
export class IgnoreRules {
  constructor(base, lines) {
    this.base = base
    this.rules = lines.map(parse).filter((r) => r !== undefined)
  }

  /** true: `path` is ignored; false: taken back in by a `!` pattern; undefined: no pattern of this file matches. */
  decide(path, isDir) {
    if (this.base) {
      if (!path.startsWith(`${this.base}/`)) return undefined
      path = path.slice(this.base.length + 1)
    }
    const name = path.slice(path.lastIndexOf('/') + 1)
    for (let i = this.rules.length - 1; i >= 0; i--) {
      const rule = this.rules[i]
      if (rule.dirOnly && !isDir) continue
      if (rule.regex.test(rule.anchored ? path : name)) return !rule.negated
    }
    return undefined
  }
}

/** Whether the ignore files in force (outermost first) leave `path` out. */
export function isIgnored(stack, path, isDir) {
  for (let i = stack.length - 1; i >= 0; i--) {
    const decision = stack[i].decide(path, isDir)
    if (decision !== undefined) return decision
  }
  return false
}
