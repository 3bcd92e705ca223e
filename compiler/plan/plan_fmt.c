/* plan_fmt.c - the units of the planner's reports and messages (plan.h):
 * bytes in binary multiples, seconds, counts. */
#include <math.h>
#include <stdio.h>

#include "plan.h"

const char *plan_fmt_bytes(char *buf, size_t n, double b) {
  const double K = 1024.0;
  if (!isfinite(b)) snprintf(buf, n, "inf");
  else if (b >= K * K * K * K) snprintf(buf, n, "%.2f TiB", b / (K * K * K * K));
  else if (b >= K * K * K) snprintf(buf, n, "%.2f GiB", b / (K * K * K));
  else if (b >= K * K) snprintf(buf, n, "%.1f MiB", b / (K * K));
  else if (b >= K) snprintf(buf, n, "%.1f KiB", b / K);
  else snprintf(buf, n, "%.0f B", b);
  return buf;
}

const char *plan_fmt_time(char *buf, size_t n, double s) {
  if (!isfinite(s)) snprintf(buf, n, "inf");
  else if (s >= 1) snprintf(buf, n, "%.2f s", s);
  else if (s >= 1e-3) snprintf(buf, n, "%.2f ms", s * 1e3);
  else if (s > 0) snprintf(buf, n, "%.1f us", s * 1e6);
  else snprintf(buf, n, "0");
  return buf;
}

const char *plan_fmt_count(char *buf, size_t n, double v) {
  if (v >= 1e15) snprintf(buf, n, "%.2fP", v / 1e15);
  else if (v >= 1e12) snprintf(buf, n, "%.2fT", v / 1e12);
  else if (v >= 1e9) snprintf(buf, n, "%.2fB", v / 1e9);
  else if (v >= 1e6) snprintf(buf, n, "%.1fM", v / 1e6);
  else if (v >= 1e3) snprintf(buf, n, "%.1fK", v / 1e3);
  else snprintf(buf, n, "%.0f", v);
  return buf;
}
