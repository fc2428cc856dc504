// @ts-check
/**
 * Device colours shared by every view.
 *
 * One colour per device id, identical in every view and in the static HTML that
 * `jaxpar_magic/views/palette.py` renders: both files implement the same formula with
 * integer hue steps and the same floating-point operations, so they agree to the byte
 * (a browser test compares all ids 0..4095).
 *
 * Formula: hue = golden-angle steps of 137.51 degrees, kept in integer hundredths of a
 * degree (36,000 distinct hues before a repeat); saturation cycles over 3 values (so ids a
 * power of two apart always differ), lightness over 4 picked by XOR-folding the id's base-4
 * digits (so ids 4, 16, 64... apart, vertical neighbours in a mesh, differ in lightness too).
 * All lightnesses are pastel (>= 70%): dark text stays readable on every tile, in light and
 * dark themes.
 */

/**
 * Devices 0-7: colours picked for readers with a colour-vision deficiency (every two differ by a
 * CIELAB distance of at least 19 under simulated protanopia, deuteranopia and tritanopia); the
 * twin of views/palette.py's CVD_SAFE, where the check is described.
 */
const CVD_SAFE = ["#78c1d6", "#eed936", "#aef077", "#5ef0d4", "#e1eaae", "#f58c98", "#a69ff5", "#d4a16c"];
const SATURATION = [0.62, 0.5, 0.74];
const LIGHTNESS = [0.8, 0.72, 0.86, 0.76];

/** @param {number} v 0..255 */
function hex2(v) {
  return v.toString(16).padStart(2, "0");
}

/**
 * Colour of one device.
 * @param {number} id device id (a non-negative integer)
 * @returns {{bg: string, fg: string}} background as `#rrggbb` and a readable text colour
 */
export function deviceColor(id) {
  const n = Math.abs(Math.trunc(id));
  if (n < CVD_SAFE.length) return { bg: CVD_SAFE[n], fg: "#111111" };
  const hue = ((n * 13751) % 36000) / 100;
  const s = SATURATION[n % 3];
  let fold = 0;
  for (let m = n; m > 0; m = Math.floor(m / 4)) fold ^= m % 4;
  const l = LIGHTNESS[fold];
  const c = (1 - Math.abs(2 * l - 1)) * s;
  const hp = hue / 60;
  const x = c * (1 - Math.abs((hp % 2) - 1));
  let r = 0;
  let g = 0;
  let b = 0;
  if (hp < 1) [r, g, b] = [c, x, 0];
  else if (hp < 2) [r, g, b] = [x, c, 0];
  else if (hp < 3) [r, g, b] = [0, c, x];
  else if (hp < 4) [r, g, b] = [0, x, c];
  else if (hp < 5) [r, g, b] = [x, 0, c];
  else [r, g, b] = [c, 0, x];
  const m = l - c / 2;
  const rgb = [r, g, b].map((v) => Math.floor((v + m) * 255 + 0.5));
  const lum = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255;
  return { bg: "#" + rgb.map(hex2).join(""), fg: lum > 0.45 ? "#111111" : "#ffffff" };
}
