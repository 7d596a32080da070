// A small PNG decoder for the desktop tests (8-bit RGB or RGBA, not interlaced: what scrot
// writes), so the tests read pixels without a dependency.

import { inflateSync } from 'node:zlib'

/** `{ width, height, pixel(x, y) → [r, g, b] }` of a PNG. */
export function decodePng(bytes) {
  const buf = Buffer.from(bytes)
  if (buf.subarray(0, 8).toString('binary') !== '\x89PNG\r\n\x1a\n') throw new Error('not a PNG')
  let offset = 8
  let width, height, channels
  const idat = []
  while (offset < buf.length) {
    const length = buf.readUInt32BE(offset)
    const type = buf.toString('ascii', offset + 4, offset + 8)
    const data = buf.subarray(offset + 8, offset + 8 + length)
    if (type === 'IHDR') {
      width = data.readUInt32BE(0)
      height = data.readUInt32BE(4)
      const [depth, colour, , , interlace] = data.subarray(8)
      if (depth !== 8 || interlace !== 0 || (colour !== 2 && colour !== 6)) {
        throw new Error(`unsupported PNG: depth ${depth}, colour type ${colour}, interlace ${interlace}`)
      }
      channels = colour === 2 ? 3 : 4
    } else if (type === 'IDAT') {
      idat.push(data)
    }
    offset += 12 + length
  }
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * channels
  const out = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const row = y * stride
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? out[row + i - channels] : 0
      const b = y > 0 ? out[row - stride + i] : 0
      const c = i >= channels && y > 0 ? out[row - stride + i - channels] : 0
      let v = line[i]
      if (filter === 1) v += a
      else if (filter === 2) v += b
      else if (filter === 3) v += (a + b) >> 1
      else if (filter === 4) {
        const p = a + b - c
        const pa = Math.abs(p - a)
        const pb = Math.abs(p - b)
        const pc = Math.abs(p - c)
        v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c
      }
      out[row + i] = v & 0xff
    }
  }
  return {
    width,
    height,
    pixel(x, y) {
      const i = y * stride + x * channels
      return [out[i], out[i + 1], out[i + 2]]
    },
  }
}
