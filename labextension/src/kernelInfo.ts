/**
 * Asking a kernel which implementation answers it now, with a bound on the wait.
 *
 * `kernel.info` keeps the first kernel's answer across a reconnect to a new process, so the
 * notebook asks again. A request sent on a websocket that the server has just closed (a move
 * drops the kernel's websockets) is never answered and never cancelled: waiting on it alone
 * would wait for ever, and the cells held for the move would never run.
 */

/** The part of a kernel connection this needs. */
export interface IInfoAsker {
  requestKernelInfo(): Promise<{ content?: unknown } | undefined>;
}

/** How long a kernel_info request may go unanswered before the caller may ask again. */
export const INFO_TIMEOUT_MS = 5000;

/** The kernel's `implementation`, or '' when there is no kernel, no answer within `timeoutMs`,
 * or the request failed. */
export async function askImplementation(
  kernel: IInfoAsker | null | undefined,
  timeoutMs = INFO_TIMEOUT_MS
): Promise<string> {
  if (!kernel) {
    return '';
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const reply = await Promise.race([
      kernel.requestKernelInfo(),
      new Promise<undefined>(resolve => {
        timer = setTimeout(() => resolve(undefined), timeoutMs);
      })
    ]);
    const content = reply?.content as { implementation?: unknown } | undefined;
    return typeof content?.implementation === 'string' ? content.implementation : '';
  } catch {
    return '';
  } finally {
    clearTimeout(timer);
  }
}
