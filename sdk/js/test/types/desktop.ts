// The desktop API's type declarations, used as a program would (checked by `npm run typecheck`).
import { Lizard, DesktopError } from '@lizard-build/sdk'

async function computerUse(): Promise<void> {
  const lizard = new Lizard({ project: 'my-project' })
  const sandbox = await lizard.create('desktop', { resolution: [1280, 800] })
  const { width, height } = await sandbox.desktop.getScreenSize()
  const png: Uint8Array = await sandbox.desktop.screenshot()
  await sandbox.desktop.leftClick(width / 2, height / 2)
  await sandbox.desktop.doubleClick()
  await sandbox.desktop.drag([10, 10], [200, 200])
  await sandbox.desktop.scroll('down', 3)
  await sandbox.desktop.mousePress('right')
  await sandbox.desktop.mouseRelease('right')
  await sandbox.desktop.write('hello', { chunkSize: 10 })
  await sandbox.desktop.press(['ctrl', 'l'])
  await sandbox.desktop.open('https://example.com')
  await sandbox.desktop.launch('chromium')
  await sandbox.desktop.wait(500)
  const { x, y } = await sandbox.desktop.getCursorPosition()
  await sandbox.desktop.stream.start()
  const url: string = sandbox.desktop.stream.getUrl({ viewOnly: true, port: 7172 })
  await sandbox.desktop.stream.stop()
  console.log(png.length, x, y, url, new DesktopError('x') instanceof Error)
}
void computerUse
