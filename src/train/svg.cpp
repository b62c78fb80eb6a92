// The SVG writer: elements appended as text; numbers with two decimals, enough for pixels.
#include "train/svg.h"

#include <fmt/format.h>

namespace shardtrain::train {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

SvgWriter::SvgWriter(double width, double height) : width_(width), height_(height) {}

void SvgWriter::rect(double x, double y, double width, double height, std::string_view style) {
  body_ += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" style=\"{}\"/>\n", x, y, width,
                       height, xml_escape(style));
}

void SvgWriter::line(double x1, double y1, double x2, double y2, std::string_view style) {
  body_ += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" style=\"{}\"/>\n", x1, y1, x2, y2,
                       xml_escape(style));
}

void SvgWriter::circle(double cx, double cy, double r, std::string_view style) {
  body_ += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{:g}\" style=\"{}\"/>\n", cx, cy, r, xml_escape(style));
}

void SvgWriter::text(double x, double y, std::string_view content, std::string_view anchor, double size,
                     std::string_view css_class, double rotate) {
  std::string attrs = fmt::format("x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"{}\" font-size=\"{:g}\"", x, y, anchor, size);
  if (!css_class.empty()) attrs += fmt::format(" class=\"{}\"", xml_escape(css_class));
  if (rotate != 0) attrs += fmt::format(" transform=\"rotate({:g} {:.2f} {:.2f})\"", rotate, x, y);
  body_ += fmt::format("<text {}>{}</text>\n", attrs, xml_escape(content));
}

void SvgWriter::polyline(const std::vector<std::pair<double, double>>& points, std::string_view series,
                         std::string_view style) {
  std::string pts;
  pts.reserve(points.size() * 16);
  for (const auto& [x, y] : points) {
    if (!pts.empty()) pts += ' ';
    pts += fmt::format("{:.2f},{:.2f}", x, y);
  }
  body_ += fmt::format("<polyline data-series=\"{}\" points=\"{}\" style=\"fill:none;{}\"/>\n", xml_escape(series), pts,
                       xml_escape(style));
}

std::string SvgWriter::finish() const {
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                     "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:g}\" height=\"{:g}\" viewBox=\"0 0 {:g} {:g}\" "
                     "font-family=\"sans-serif\">\n"
                     "<rect x=\"0\" y=\"0\" width=\"{:g}\" height=\"{:g}\" style=\"fill:white\"/>\n"
                     "{}</svg>\n",
                     width_, height_, width_, height_, width_, height_, body_);
}

}  // namespace shardtrain::train
