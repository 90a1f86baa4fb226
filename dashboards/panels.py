"""The panels every l9gpu dashboard is made of, built with Grafana's own dashboards-as-code SDK
(grafana-foundation-sdk, generated from Grafana's schemas): one function per panel kind, so
that every panel shares the same data source, legend, units and layout rules.

A panel here is a `grafana_foundation_sdk` builder; `Board` lays them out on Grafana's
24-column grid and numbers them, and `dashboard` wraps a board in the variables, links and
annotations both dashboards share.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Union

from grafana_foundation_sdk.builders import bargauge as sdk_bargauge
from grafana_foundation_sdk.builders import common as sdk_common
from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.builders import prometheus as sdk_prometheus
from grafana_foundation_sdk.builders import stat as sdk_stat
from grafana_foundation_sdk.builders import table as sdk_table
from grafana_foundation_sdk.builders import timeseries as sdk_timeseries
from grafana_foundation_sdk.models import common, prometheus
from grafana_foundation_sdk.models import dashboard as model

Panel = Union[sdk_timeseries.Panel, sdk_stat.Panel, sdk_table.Panel, sdk_bargauge.Panel]
Target = sdk_prometheus.Dataquery
Override = tuple[str, str, list[model.DynamicConfigValue]]  # (matcher id, matcher options, properties)
Steps = list[tuple[str, Union[float, None]]]

# Every panel and query reads the data source the dashboard's `datasource` variable picks.
DS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
DASHED = common.LineStyle(fill="dash", dash=[10, 10])

# Selectors every panel starts from. `$node`, `$namespace`, `$gpu` are multi-value
# variables whose "All" value is `.*`, so `=~` keeps working when everything is selected.
DEV = 'node=~"$node", gpu=~"$gpu"'
WL = 'node=~"$node", gpu=~"$gpu", namespace=~"$namespace"'
POD = WL + ', pod!=""'
# Self-metrics without a `node` label get it from l9gpu_host_pids_visible of the same target.
WITH_NODE = ('on (instance, job) group_left (node) '
             'group by (instance, job, node) (l9gpu_host_pids_visible{node=~"$node"})')


class Board:
    """Lays panels out on Grafana's 24-column grid, left to right, top to bottom, in rows."""

    def __init__(self, builder: sdk.Dashboard) -> None:
        self.builder = builder
        self._x = 0
        self._y = 0
        self._row_h = 0
        self._id = 0

    def _next_id(self) -> int:
        self._id += 1
        return self._id

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
            self._x = 0
            self._row_h = 0

    def row(self, title: str) -> None:
        """Starts an expanded row: the panels added next belong to it."""
        self._newline()
        self.builder.with_row(sdk.Row(title).id(self._next_id()).collapsed(False)
                              .grid_pos(model.GridPos(h=1, w=24, x=0, y=self._y)))
        self._y += 1

    def add(self, panel: Panel, w: int, h: int) -> Panel:
        """Places `panel` (w columns by h grid units) after the last one, on a new line if it does not fit."""
        if self._x + w > 24:
            self._newline()
        panel.id(self._next_id()).grid_pos(model.GridPos(h=h, w=w, x=self._x, y=self._y))
        self._x += w
        self._row_h = max(self._row_h, h)
        self.builder.with_panel(panel)
        return panel


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Target:
    query = (sdk_prometheus.Dataquery().datasource(DS).ref_id(ref).expr(expr).legend_format(legend or "__auto"))
    query.instant() if instant else query.range()
    if table:
        query.format(prometheus.PromQueryFormat.TABLE)
    return query


def thresholds(steps: Steps) -> sdk.ThresholdsConfig:
    return (sdk.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(color=color, value=value) for color, value in steps]))


def _common(panel: Any, title: str, targets: list[Target], unit: str | None, description: str) -> Any:
    panel.title(title).description(description).datasource(DS)
    for query in targets:
        panel.with_target(query)
    if unit is not None:
        panel.unit(unit)
    return panel


def _overrides(panel: Any, overrides: list[Override] | None) -> None:
    panel.overrides([])  # an empty list when there are none, as Grafana saves it
    for matcher, options, properties in overrides or []:
        panel.with_override(model.MatcherConfig(id_val=matcher, options=options), properties)


def timeseries(title: str, targets: list[Target], unit: str, description: str = "", *,
               stack: bool = False, minimum: float | None = 0, maximum: float | None = None,
               overrides: list[Override] | None = None, steps: Steps | None = None,
               draw: common.GraphDrawStyle = common.GraphDrawStyle.LINE) -> sdk_timeseries.Panel:
    panel = _common(sdk_timeseries.Panel(), title, targets, unit, description)
    (panel.draw_style(draw).line_width(1).fill_opacity(30 if stack else 10).show_points(common.VisibilityMode.NEVER)
     .stacking(sdk_common.StackingConfig()
               .mode(common.StackingMode.NORMAL if stack else common.StackingMode.NONE).group("A"))
     .span_nulls(False))
    if minimum is not None:
        panel.min(minimum)
    if maximum is not None:
        panel.max(maximum)
    if steps:
        panel.thresholds(thresholds(steps))
        panel.thresholds_style(sdk_common.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED))
    _overrides(panel, overrides)
    panel.legend(sdk_common.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.TABLE)
                 .placement(common.LegendPlacement.RIGHT).calcs(["lastNotNull", "max"]))
    panel.tooltip(sdk_common.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                  .sort(common.SortOrder.DESCENDING))
    return panel


def _last_value() -> sdk_common.ReduceDataOptions:
    return sdk_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def stat(title: str, targets: list[Target], unit: str, description: str = "",
         steps: Steps | None = None, decimals: int | None = None) -> sdk_stat.Panel:
    panel = _common(sdk_stat.Panel(), title, targets, unit, description)
    panel.thresholds(thresholds(steps or [("green", None)]))
    panel.color_scheme(sdk.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
    if decimals is not None:
        panel.decimals(decimals)
    _overrides(panel, None)
    (panel.reduce_options(_last_value()).color_mode(common.BigValueColorMode.VALUE)
     .graph_mode(common.BigValueGraphMode.AREA).text_mode(common.BigValueTextMode.AUTO))
    return panel


# Labels every table hides: the agent's target, identifiers a reader does not need per row.
HIDDEN_COLUMNS = ("Time", "__name__", "job", "instance", "uuid", "pod_uid", "gpu_instance", "model")


def table(title: str, targets: list[Target], description: str = "", *, hide: list[str] | None = None,
          rename: dict[str, str] | None = None, sort: str | None = None,
          overrides: list[Override] | None = None) -> sdk_table.Panel:
    """An instant-query table; several targets are merged on their common labels.

    Overrides name columns as renamed (``rename`` maps ``Value #A`` to a header).
    """
    panel = _common(sdk_table.Panel(), title, targets, None, description)
    excluded = {name: True for name in (*HIDDEN_COLUMNS, *(hide or []))}
    if len(targets) > 1:
        panel.with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
    panel.with_transformation(model.DataTransformerConfig(
        id_val="organize", options={"excludeByName": excluded, "renameByName": rename or {}}))
    if sort:
        panel.with_transformation(model.DataTransformerConfig(
            id_val="sortBy", options={"sort": [{"field": sort, "desc": True}]}))
    panel.align(common.FieldTextAlignment.AUTO).filterable(True)
    _overrides(panel, overrides)
    panel.show_header(True).footer(sdk_common.TableFooterOptions().show(False))
    return panel


def bargauge(title: str, targets: list[Target], unit: str, description: str = "",
             maximum: float | None = None) -> sdk_bargauge.Panel:
    panel = _common(sdk_bargauge.Panel(), title, targets, unit, description)
    panel.min(0).color_scheme(sdk.FieldColor().mode(model.FieldColorModeId.CONTINUOUS_GR_YL_RD))
    panel.thresholds(thresholds([("green", None)]))
    if maximum is not None:
        panel.max(maximum)
    _overrides(panel, None)
    (panel.orientation(common.VizOrientation.HORIZONTAL).display_mode(common.BarGaugeDisplayMode.GRADIENT)
     .show_unfilled(True).reduce_options(_last_value()))
    return panel


def _properties(props: dict[str, Any]) -> list[model.DynamicConfigValue]:
    """Field-config properties by their Grafana ids: `custom__fillOpacity` is `custom.fillOpacity`."""
    return [model.DynamicConfigValue(id_val=key.replace("__", "."), value=value) for key, value in props.items()]


def by_name(name: str, **props: Any) -> Override:
    return ("byName", name, _properties(props))


def by_regexp(pattern: str, **props: Any) -> Override:
    return ("byRegexp", pattern, _properties(props))


def colour_cells() -> common.TableColoredBackgroundCellOptions:
    """A table cell coloured by its thresholds."""
    return common.TableColoredBackgroundCellOptions(mode=common.TableCellBackgroundDisplayMode.BASIC)


def variable(name: str, label: str, query: str, *, multi: bool = True) -> sdk.QueryVariable:
    """A Prometheus label_values() variable, several values or All (`.*`) selected."""
    return (sdk.QueryVariable(name).label(label).datasource(DS)
            .query({"query": query, "refId": f"{name}-query"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.NUMERICAL_ASC)
            .multi(multi).include_all(True).all_value(".*")
            .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .options([]).regex("").hide(model.VariableHide.DONT_HIDE))


def dashboard(uid: str, title: str, description: str, tags: list[str], variables: list[sdk.QueryVariable],
              rows: Sequence[Callable[[Board], None]]) -> model.Dashboard:
    """A dashboard of `rows` (each a function that adds a row and its panels to a board)."""
    builder = (sdk.Dashboard(title).uid(uid).description(description).tags(tags).version(1).editable()
               .tooltip(model.DashboardCursorSync.CROSSHAIR).time("now-6h", "now").refresh("30s").timezone("")
               .with_variable(sdk.DatasourceVariable("datasource").label("Data source").type("prometheus")
                              .hide(model.VariableHide.DONT_HIDE).regex(""))
               .annotation(sdk.AnnotationQuery().built_in(1).name("Annotations & Alerts").type("dashboard")
                           .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                           .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)"))
               .link(sdk.DashboardLink("l9gpu dashboards").type(model.DashboardLinkType.DASHBOARDS).tags(["l9gpu"])
                     .as_dropdown(True).include_vars(True).keep_time(True)))
    for var in variables:
        builder.with_variable(var)
    board = Board(builder)
    for add_row in rows:
        add_row(board)
    return builder.build()


NODE_VAR = variable("node", "Node", "label_values(gpu_info, node)")
GPU_VAR = variable("gpu", "GPU", 'label_values(gpu_info{node=~"$node"}, gpu)')
NAMESPACE_VAR = variable("namespace", "Namespace",
                         'label_values(container_gpu_memory_used_bytes{node=~"$node"}, namespace)')


def fixed_colour(colour: str) -> model.FieldColor:
    """A series drawn in one colour (a Grafana colour name)."""
    return model.FieldColor(mode=model.FieldColorModeId.FIXED, fixed_color=colour)
