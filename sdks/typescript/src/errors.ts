/** The worker API's refusals, by SQLSTATE (stable across versions). */

/** `MR001`: not a resume matcher committed (forged, altered, addressed to another run, or
 * not a resume at all). */
export class UnverifiedResume extends Error {
  override readonly name = "UnverifiedResume";
}

/** `22023`: an argument is refused (empty text, more than 512 bytes, a negative position...). */
export class InvalidArgument extends Error {
  override readonly name = "InvalidArgument";
}

/** `P0002`: no such launch or wait. */
export class NotFound extends Error {
  override readonly name = "NotFound";
}

/** The SQLSTATE of a database error, if it is one. */
export function sqlState(error: unknown): string | undefined {
  if (error !== null && typeof error === "object" && "code" in error) {
    const code = (error).code;
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}

/** The worker API's refusal for a database error, or the error itself. */
export function translate(error: unknown): unknown {
  const message = error instanceof Error ? error.message : String(error);
  switch (sqlState(error)) {
    case "MR001":
      return new UnverifiedResume(message, { cause: error });
    case "22023":
      return new InvalidArgument(message, { cause: error });
    case "P0002":
      return new NotFound(message, { cause: error });
    default:
      return error;
  }
}
