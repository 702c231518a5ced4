// The page's inline CSS and JS (assets/report.css, assets/report.js),
// compiled in at build time (cmake/embed_text.cmake).
#pragma once

namespace moetier::report {
extern const char* const kReportJs;
extern const char* const kReportCss;
}  // namespace moetier::report
