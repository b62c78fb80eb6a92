// A small SVG writer: the shapes and text a chart needs, escaped, in one <svg> document.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardtrain::train {

// Text with &, <, >, " and ' escaped for XML content and attribute values.
std::string xml_escape(std::string_view text);

class SvgWriter {
 public:
  SvgWriter(double width, double height);

  void rect(double x, double y, double width, double height, std::string_view style);
  void line(double x1, double y1, double x2, double y2, std::string_view style);
  // anchor: start, middle or end; `css_class` "" for none
  void text(double x, double y, std::string_view content, std::string_view anchor, double size,
            std::string_view css_class = "", double rotate = 0);
  void circle(double cx, double cy, double r, std::string_view style);
  // One <polyline> through `points` (x, y), tagged data-series="`series`".
  void polyline(const std::vector<std::pair<double, double>>& points, std::string_view series, std::string_view style);

  // The whole document, <svg> closed.
  std::string finish() const;

 private:
  double width_, height_;
  std::string body_;
};

}  // namespace shardtrain::train
